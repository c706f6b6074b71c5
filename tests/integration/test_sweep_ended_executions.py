"""Executions stopped outside Relevo (the Step Functions API, as the console does it): the sweep
mirrors the ending onto the job, gives back its queue slot once and frees its lock and waiting
place; a second sweep changes nothing. On the embedded stack with job.asl.json itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_core.recovery.sweeper import MIN_AGE, SweepReport, end_job_of_ended_execution, sweep
from relevo_core.store import wait_order
from relevo_core.store.codec import from_attributes
from tests.helpers.stack import (
    QueueSlots,
    history,
    job_execution_arn,
    receive_stage,
    register_project,
    table_items,
    wait_until,
)
from tests.helpers.state_machine import claim_and_accept, enqueue_job, wait_for_run_token

STAGES = [{"name": "build", "run": "true"}]


def _records(stack, pk: str) -> dict:
    return {i["sk"]["S"]: from_attributes(i) for i in table_items(stack, pk)}


def _job(stack, job_id) -> dict:
    return _records(stack, f"JOB#{job_id}")["JOB"]


def _lock(stack, project_id) -> dict:
    return _records(stack, f"LOCK#{project_id}")["LOCK"]


# The job's final status (and error cause) for the status a stopped execution reports.
MIRRORED = {"ABORTED": ("canceled", None), "FAILED": ("failed", "execution_failed")}


def _stop(stack, job_id: str, run_token: str | None = None) -> str:
    """Stop the execution as the console does, wait until it has ended, and return its status.

    The holder of `run_token` keeps heartbeating (refused once it ended), as an agent would. AWS
    reports every stopped execution ABORTED; moto 5.2.5 reported one stopped inside the stage Map
    FAILED until the local stack made a stop end its waits ABORTED (relevo_local/moto/stepfunctions.py),
    and the mirrored status still follows what the execution reports."""
    sfn = client("stepfunctions")
    arn = job_execution_arn(stack, job_id)
    sfn.stop_execution(executionArn=arn, cause="stopped in the console")

    def ended() -> bool:
        if run_token:
            try:
                sfn.send_task_heartbeat(taskToken=run_token)
            except ClientError:
                pass  # refused: the execution has ended
        return sfn.describe_execution(executionArn=arn)["status"] != "RUNNING"

    wait_until(ended, 60, f"{job_id} stopped")
    status = str(sfn.describe_execution(executionArn=arn)["status"])
    assert status in MIRRORED, status
    return status


def _last_state_entered(stack, job_id: str) -> str | None:
    entered = [e for e in history(stack, job_id) if e["type"].endswith("StateEntered")]
    return entered[-1]["stateEnteredEventDetails"]["name"] if entered else None


def _running_and_waiting(stack, settings, project_id) -> tuple[str, str, str]:
    """One job of the project runs (an agent claimed its stage and holds the run token); a second
    one waits for the project's lock, still queued, holding a queue slot. Returns both job ids
    and the run token."""
    # The sweep repairs the whole table, and earlier tests on this shared stack may have left
    # executions that ended outside Relevo: repaired first, so what the test's own sweep reports
    # and gives back is this test's.
    sweep(settings, datetime.now(UTC))
    register_project(stack, project_id, STAGES, lease_ttl_sec=60, queue_timeout_sec=600)
    running = enqueue_job(stack, settings, project_id)
    task, _ = receive_stage(stack, running)
    run_token = wait_for_run_token(claim_and_accept(stack, task, "mac-a", lease_ttl_sec=60))
    waiting = enqueue_job(stack, settings, project_id)
    wait_until(
        lambda: _job(stack, waiting).get("waiting_for") == project_id, 60, f"{waiting} waits for {project_id}"
    )
    # Parked in WaitForProject, where a waiter spends nearly all its time (a stop while the other
    # states of its loop run is a different moment to stop it at, not tested here).
    wait_until(
        lambda: _last_state_entered(stack, waiting) == "WaitForProject",
        60,
        f"{waiting} parked in WaitForProject",
    )
    assert (_job(stack, running)["status"], _job(stack, waiting)["status"]) == ("running", "queued")
    return running, waiting, run_token


def _assert_ended_by_sweeper(record: dict, execution_status: str) -> None:
    status, cause = MIRRORED[execution_status]
    assert (record["status"], record["last_writer"], record.get("error_cause")) == (status, "sweeper", cause)
    assert record.get("ended_at") and not {"waiting_for", "queue_reason", "start_pending"} & set(record)


def test_stopped_executions_end_their_jobs_free_the_lock_and_give_back_a_slot_once(
    local_stack, intake_settings, project_id
):
    running, waiting, run_token = _running_and_waiting(local_stack, intake_settings, project_id)
    running_ended = _stop(local_stack, running, run_token)
    assert _stop(local_stack, waiting) == "ABORTED"
    # Stopped from outside, neither job moved: the lock is held, the waiter keeps its place and slot.
    assert (_job(local_stack, running)["status"], _job(local_stack, waiting)["status"]) == (
        "running",
        "queued",
    )
    assert _lock(local_stack, project_id)["holders"] == {running}
    slots = QueueSlots(local_stack, project_id)

    report = sweep(intake_settings, datetime.now(UTC))

    assert sorted(report.jobs_ended) == sorted(
        [f"{running}:{MIRRORED[running_ended][0]}", f"{waiting}:canceled"]
    )
    _assert_ended_by_sweeper(_job(local_stack, running), running_ended)
    _assert_ended_by_sweeper(_job(local_stack, waiting), "ABORTED")
    # Only the queued job held a slot (the running one gave its back when it started).
    assert slots.change() == -1
    assert (
        f"{project_id}:{running}" in report.locks_freed
        and f"{project_id}:{waiting}" in report.waiters_dropped
    )
    lock = _lock(local_stack, project_id)
    assert lock["count"] == 0 and "holders" not in lock and "waiters" not in lock
    assert wait_order.waiting_jobs(local_stack.table_name, project_id) == []

    # A second sweep, even one that also sees the jobs as unstarted and old, changes nothing.
    records = {job_id: _job(local_stack, job_id) for job_id in (running, waiting)}
    again = sweep(intake_settings, datetime.now(UTC) + MIN_AGE + timedelta(minutes=1))

    assert not {running, waiting} & {entry.split(":")[0] for entry in again.jobs_ended}
    assert not any(project_id in entry for entry in again.locks_freed + again.waiters_dropped)
    assert {job_id: _job(local_stack, job_id) for job_id in (running, waiting)} == records
    assert slots.change() == 0


def test_a_job_stopped_while_queued_is_found_among_unstarted_jobs_too(
    local_stack, intake_settings, project_id
):
    """The sweep that runs the start-pending pass first ends the job there; the waiter pass then
    only drops its place, and the slot still comes back once."""
    running, waiting, run_token = _running_and_waiting(local_stack, intake_settings, project_id)
    assert _stop(local_stack, waiting) == "ABORTED"
    slots = QueueSlots(local_stack, project_id)

    report = sweep(intake_settings, datetime.now(UTC) + MIN_AGE + timedelta(seconds=1))

    assert waiting in report.already_running and f"{waiting}:canceled" in report.jobs_ended
    assert f"{project_id}:{waiting}" in report.waiters_dropped
    _assert_ended_by_sweeper(_job(local_stack, waiting), "ABORTED")
    assert slots.change() == -1
    # The running job's execution is alive: untouched, it keeps the lock.
    assert _job(local_stack, running)["status"] == "running" and _lock(local_stack, project_id)[
        "holders"
    ] == {running}
    _stop(local_stack, running, run_token)
    sweep(intake_settings, datetime.now(UTC))
    assert _lock(local_stack, project_id)["count"] == 0


def test_an_execution_that_timed_out_or_failed_without_a_last_state_fails_its_job(
    local_stack, intake_settings, project_id
):
    """job.asl.json sets no execution timeout and catches its failures, so the emulator cannot end
    one that way by itself: the job's ending is decided here from the status its (stopped)
    execution would report, on the real records."""
    timed_out, failed, run_token = _running_and_waiting(local_stack, intake_settings, project_id)
    _stop(local_stack, timed_out, run_token)
    _stop(local_stack, failed)
    slots = QueueSlots(local_stack, project_id)
    now = datetime.now(UTC)
    report = SweepReport()

    end_job_of_ended_execution(intake_settings, timed_out, "TIMED_OUT", now, report)
    end_job_of_ended_execution(intake_settings, failed, "FAILED", now, report)
    end_job_of_ended_execution(
        intake_settings, failed, "ABORTED", now, report
    )  # already ended: left as it is

    assert report.jobs_ended == [f"{timed_out}:failed", f"{failed}:failed"]
    for job_id, error, cause in [
        (timed_out, "Relevo.Execution.TimedOut", "execution_timed_out"),
        (failed, "Relevo.Execution.Failed", "execution_failed"),
    ]:
        record = _job(local_stack, job_id)
        assert (record["status"], record["last_writer"], record["error_name"], record["error_cause"]) == (
            "failed",
            "sweeper",
            error,
            cause,
        )
        assert record.get("ended_at") and not {"waiting_for", "queue_reason", "start_pending"} & set(record)
    assert slots.change() == -1  # the queued one's slot

    records = {job_id: _job(local_stack, job_id) for job_id in (timed_out, failed)}
    sweep(intake_settings, now)  # frees the lock and the waiting place; the jobs stay as mirrored
    assert {job_id: _job(local_stack, job_id) for job_id in (timed_out, failed)} == records
    assert _lock(local_stack, project_id)["count"] == 0 and slots.change() == 0


def test_a_running_succeeded_or_unknown_execution_never_changes_its_job(
    local_stack, intake_settings, project_id
):
    register_project(local_stack, project_id, STAGES, lease_ttl_sec=60)
    job_id = enqueue_job(local_stack, intake_settings, project_id)
    task, _ = receive_stage(local_stack, job_id)
    run_token = wait_for_run_token(claim_and_accept(local_stack, task, "mac-a", lease_ttl_sec=60))
    before = _job(local_stack, job_id)
    report = SweepReport()

    for status in ("RUNNING", "SUCCEEDED", "PENDING_REDRIVE", "MISSING"):
        end_job_of_ended_execution(intake_settings, job_id, status, datetime.now(UTC), report)

    assert report.jobs_ended == [] and _job(local_stack, job_id) == before
    # The sweep itself leaves a live execution's job alone...
    sweep(intake_settings, datetime.now(UTC))
    assert _job(local_stack, job_id) == before
    # ...and ends it once it was stopped.
    ended = _stop(local_stack, job_id, run_token)
    sweep(intake_settings, datetime.now(UTC))
    _assert_ended_by_sweeper(_job(local_stack, job_id), ended)
