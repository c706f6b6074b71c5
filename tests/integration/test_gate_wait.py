"""A job queued behind its project's job that waits at its approval gate: it is not failed by its
queue timeout meanwhile, and says why it waits (project_waiting_for_approval, naming that job, the
stage it waits before and since when) in the API, `relevo queue` and `relevo job view`. Behind a
job that runs it says project_running, and its queue timeout counts as before
(test_waiting_history.py: a job that waits out its queue timeout fails)."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from relevo_cli.main import app
from relevo_core import execution
from relevo_core.aws import client
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.projects.lock_handoff import wake_next_waiter
from tests.helpers.stack import (
    QueueSlots,
    history,
    job_execution_arn,
    job_record,
    queue_filled,
    receive_stage,
    register_project,
    wait_for_execution,
    wait_until,
)
from tests.helpers.state_machine import (
    OUTSIDE_HOLDER,
    agent_runs,
    answer_gate_outside,
    enqueue_job,
    gate_outside,
    hold_outside,
    release_outside,
)

runner = CliRunner()
STAGES = [{"name": "build", "run": "make"}, {"name": "upload", "run": "fastlane upload"}]
APPROVAL = {"enabled": True, "before": "upload"}
# Short enough that a job behind a running job gives up within seconds (1 s fallback reads, 5 of them).
QUEUE_TIMEOUT_SEC = 5


def _entered(stack, job_id: str) -> list[str]:
    return [
        e["stateEnteredEventDetails"]["name"]
        for e in history(stack, job_id)
        if e["type"].endswith("StateEntered")
    ]


def _at_gate(stack, api, project_id: str, queue_timeout_sec: int) -> str:
    """A job of the project whose first stage ran and which now waits before `upload`."""
    register_project(stack, project_id, STAGES, approval=APPROVAL, queue_timeout_sec=queue_timeout_sec)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(stack, job_id)
    agent_runs(stack, task)
    wait_until(
        lambda: job_record(stack, job_id).get("status") == "waiting", 30, f"{job_id} waiting at its gate"
    )
    return job_id


def _joined_the_line(stack, job_id: str) -> float:
    """The job was refused the lock and took its place in line; when (monotonic) it was seen so."""
    wait_until(lambda: job_record(stack, job_id).get("waiting_for"), 60, f"{job_id} in line")
    return time.monotonic()


def test_a_job_behind_its_projects_approval_gate_outlives_its_queue_timeout_says_why_and_runs_after(
    local_stack,
    intake_settings,
    project_id,
    api,
    stack_file,
    monkeypatch,
):
    # Given job A waiting for approval before `upload`, and job B of the same project queued behind it
    gated = _at_gate(local_stack, api, project_id, QUEUE_TIMEOUT_SEC)
    since = job_record(local_stack, gated)["updated_at"]
    slots = QueueSlots(local_stack, project_id)
    behind = enqueue_job(local_stack, intake_settings, project_id)
    joined = _joined_the_line(local_stack, behind)

    # When B's queue_timeout_sec has passed three times over
    wait_until(
        lambda: time.monotonic() - joined > 3 * QUEUE_TIMEOUT_SEC, 60, "three queue timeouts", interval=0.5
    )

    # Then B is still queued, in line, holding its queue slot (the queue limit still counts it)
    record = job_record(local_stack, behind)
    assert (record["status"], record.get("error_name")) == ("queued", None), record
    assert (
        client("stepfunctions").describe_execution(executionArn=job_execution_arn(local_stack, behind))[
            "status"
        ]
        == "RUNNING"
    )
    assert slots.change() == 1
    # and says why in the API: the job, the stage it waits before, since when
    view = api.get_job(behind)
    assert view["queue_reason"] == "project_waiting_for_approval"
    assert view["waiting_behind"] == {"job_id": gated, "stage": "upload", "since": since}
    assert (
        gated in view["queue_detail"]
        and "upload" in view["queue_detail"]
        and since[:19] in view["queue_detail"]
    )
    row = next(job for job in api.queue()["jobs"] if job["job_id"] == behind)
    assert (row["queue_reason"], row["waiting_behind"]) == (
        "project_waiting_for_approval",
        view["waiting_behind"],
    )
    listed = next(
        job for job in api.list_jobs(status="queued", project=project_id)["jobs"] if job["job_id"] == behind
    )
    assert listed["queue_reason"] == "project_waiting_for_approval"
    # and in the CLI
    wide_console(monkeypatch)
    shown = runner.invoke(app, ["job", "view", behind, "--stack-file", stack_file], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    assert (
        "project_waiting_for_approval" in shown.output
        and gated in shown.output
        and "before upload" in shown.output
    )
    assert "another job of its project is running" not in shown.output
    queue = runner.invoke(app, ["queue", "--stack-file", stack_file], env={"COLUMNS": "400"})
    assert queue.exit_code == 0, queue.output
    line = next(line for line in queue.output.splitlines() if behind in line)
    assert "project_waiting_for_approval" in line and gated in line and "upload" in line, queue.output
    # and the queue limit still refuses new jobs over it
    with queue_filled(local_stack, intake_settings.queue_limit):
        with pytest.raises(RelevoError) as refused:
            enqueue_job(local_stack, intake_settings, project_id)
    assert refused.value.code is ErrorCode.QUEUE_FULL

    # When A is approved and its gated stage succeeds
    api.approve(gated, "release signed off")
    upload, _ = receive_stage(local_stack, gated)
    assert upload["stage"] == "upload"
    agent_runs(local_stack, upload)
    assert wait_for_execution(local_stack, gated)["status"] == "SUCCEEDED"

    # Then B runs and succeeds
    build, _ = receive_stage(local_stack, behind, timeout=30)
    assert build["stage"] == "build"
    agent_runs(local_stack, build)
    wait_until(
        lambda: job_record(local_stack, behind).get("status") == "waiting", 30, f"{behind} at its own gate"
    )
    api.approve(behind)
    upload, _ = receive_stage(local_stack, behind)
    agent_runs(local_stack, upload)
    assert wait_for_execution(local_stack, behind)["status"] == "SUCCEEDED"
    assert "gate" not in _lock(local_stack, project_id)


def test_a_job_behind_a_running_job_says_project_running_until_that_job_waits_at_its_gate(
    local_stack,
    intake_settings,
    project_id,
    api,
    stack_file,
    monkeypatch,
):
    # Given job A running its first stage, and job B of the same project queued behind it
    register_project(local_stack, project_id, STAGES, approval=APPROVAL, queue_timeout_sec=600)
    running = api.run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(local_stack, running)
    behind = enqueue_job(local_stack, intake_settings, project_id)
    _joined_the_line(local_stack, behind)

    # Then B says a job of its project runs, and names no gate
    view = api.get_job(behind)
    assert (view["queue_reason"], view.get("waiting_behind")) == ("project_running", None)
    wide_console(monkeypatch)
    shown = runner.invoke(app, ["job", "view", behind, "--stack-file", stack_file], env={"COLUMNS": "400"})
    assert "another job of its project is running" in shown.output and "approval" not in shown.output, (
        shown.output
    )

    # When A's stage succeeds and A waits for approval
    agent_runs(local_stack, task)
    wait_until(
        lambda: job_record(local_stack, running).get("status") == "waiting",
        30,
        f"{running} waiting at its gate",
    )

    # Then B says so
    view = api.get_job(behind)
    assert view["queue_reason"] == "project_waiting_for_approval"
    assert (view["waiting_behind"]["job_id"], view["waiting_behind"]["stage"]) == (running, "upload")

    # When A is rejected (its job ends)
    api.reject(running, "not this one")
    assert wait_for_execution(local_stack, running)["status"] == "FAILED"

    # Then B takes the project and runs
    build, _ = receive_stage(local_stack, behind, timeout=30)
    assert build["stage"] == "build"
    api.cancel_job(behind)
    assert "gate" not in _lock(local_stack, project_id)


def _lock(stack, project_id: str) -> dict:
    from tests.helpers.stack import lock_record

    return lock_record(stack, project_id)


def test_the_queue_timeout_counts_again_once_the_gate_is_answered(local_stack, intake_settings, project_id):
    # Given a job queued behind a holder of its project's lock that waits at its gate
    register_project(
        local_stack, project_id, [{"name": "build", "run": "true"}], queue_timeout_sec=QUEUE_TIMEOUT_SEC
    )
    hold_outside(local_stack, project_id)
    gate_outside(local_stack, project_id, "2026-12-01T10:00:00Z")
    behind = enqueue_job(local_stack, intake_settings, project_id)
    joined = _joined_the_line(local_stack, behind)
    # it parks behind the gate, for long: it spends none of its queue timeout's cycles
    wait_until(lambda: _entered(local_stack, behind)[-1:] == ["WaitBehindGate"], 30, "parked behind the gate")
    assert execution.gate_wait()["park_sec"] > 100 * execution.lock_wait(QUEUE_TIMEOUT_SEC)["fallback_sec"]
    wait_until(
        lambda: time.monotonic() - joined > 2 * QUEUE_TIMEOUT_SEC, 30, "two queue timeouts", interval=0.5
    )
    assert job_record(local_stack, behind)["status"] == "queued"
    assert "CountWaitCycle" not in _entered(local_stack, behind)

    # When the gate is answered (the holder runs on: MarkApproved takes the gate off the lock) and the waiter
    # reads the lock
    answer_gate_outside(local_stack, project_id)
    wake_next_waiter(local_stack.table_name, project_id)

    # Then its queue timeout counts again: it gives up as a job behind a running job does
    described = wait_for_execution(local_stack, behind, timeout=60)
    assert (described["status"], described.get("error")) == ("FAILED", "Relevo.Timeout.Queue")
    assert (
        job_record(local_stack, behind)["error_cause"]
        == "the project stayed busy for the whole queue_timeout_sec"
    )
    release_outside(local_stack, project_id)


def test_a_release_outside_the_state_machine_takes_the_gate_off_and_a_stale_gate_says_nothing(
    local_stack, project_id
):
    from relevo_core.store import locks

    # Given a lock whose holder waits at its gate
    register_project(local_stack, project_id, [{"name": "build", "run": "true"}])
    hold_outside(local_stack, project_id)
    gate_outside(local_stack, project_id, "2026-12-01T10:00:00Z")
    assert locks.approval_gate(local_stack.table_name, project_id) == {
        "job_id": OUTSIDE_HOLDER,
        "stage": "upload",
        "since": "2026-12-01T10:00:00Z",
    }

    # When cancel or the sweep lets the lock go
    assert locks.release(local_stack.table_name, project_id, OUTSIDE_HOLDER)

    # Then the lock no longer says anyone waits at a gate
    assert "gate" not in _lock(local_stack, project_id)
    assert locks.approval_gate(local_stack.table_name, project_id) is None
    # and a gate whose job holds no lock (written after a release) is not reported
    gate_outside(local_stack, project_id, "2026-12-01T10:00:00Z")
    assert locks.approval_gate(local_stack.table_name, project_id) is None


def wide_console(monkeypatch) -> None:
    """The CLI's one console takes its width when first imported, in whichever test of this worker
    came first: rows are read whole here, so it is made wide for the test."""
    from relevo_cli.commands import common

    monkeypatch.setattr(common.console, "width", 400)
