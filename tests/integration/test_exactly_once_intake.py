"""Exactly one job per idempotency key, under concurrency, replays, repeats and a full queue.

These run the intake logic in threads against the embedded stack's real DynamoDB transactions
and Step Functions, with the settings the webhook function is deployed with."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from relevo_core.aws import client
from relevo_core.intake.busy_projects import busy_projects
from relevo_core.intake.enqueue import enqueue, project_cache
from relevo_core.models.envelope import Trigger, TriggerType
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import HeldReason
from relevo_core.recovery.sweeper import start_forgotten_jobs, sweep
from relevo_core.store import job_creation
from relevo_core.store.projects import get_project
from tests.helpers.payloads import push_body
from tests.helpers.stack import (
    QueueSlots,
    deliver,
    job_execution_arn,
    job_record,
    lock_record,
    queue_filled,
    receive_stage,
    register_project,
    table_items,
    wait_until,
)
from tests.helpers.state_machine import OUTSIDE_HOLDER, hold_outside, release_outside

STAGES = [{"name": "build", "run": "true", "exec_timeout_sec": 60}]


def _webhook(delivery_id: str | None = None) -> Trigger:
    return Trigger(type=TriggerType.WEBHOOK, source="github", delivery_id=delivery_id)


def _jobs(stack, project_id):
    return [
        i for i in table_items(stack, "JOB#") if i["sk"]["S"] == "JOB" and i["project"]["S"] == project_id
    ]


@pytest.fixture(autouse=True)
def _fresh_project_cache():
    project_cache.clear()
    busy_projects.clear()


def test_one_hundred_concurrent_deliveries_of_one_push_make_one_job(local_stack, intake_settings, project_id):
    register_project(local_stack, project_id, STAGES)
    project = get_project(local_stack.table_name, project_id)
    commit = secrets.token_hex(20)

    def deliver_once(_):
        return enqueue(intake_settings, project, _webhook(), "refs/heads/main", commit, identity=commit)

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(deliver_once, range(100)))

    created = [r for r in results if not r.duplicate]
    duplicates = [r for r in results if r.duplicate]
    assert len(created) == 1 and len(duplicates) == 99
    assert {r.job_id for r in results} == {created[0].job_id}
    assert [j["job_id"]["S"] for j in _jobs(local_stack, project_id)] == [created[0].job_id]


# 200 concurrent intake transactions over 50 keys. The jobs are written held (as a fork's pull
# request is), so none starts an execution: 50 executions waiting on one project's lock are what
# took this test minutes (each re-reads the lock every fallback period), not intake. Starting the
# execution of a created job, once, is the one-push test's above.
def test_fifty_keys_delivered_four_times_each_make_fifty_jobs(local_stack, intake_settings, project_id):
    register_project(local_stack, project_id, STAGES)
    project = get_project(local_stack.table_name, project_id)
    commits = [secrets.token_hex(20) for _ in range(50)]
    # 50 held jobs hold queue slots; the bound is tested apart.
    roomy = intake_settings.model_copy(update={"queue_limit": 100_000})

    def deliver_once(commit):
        return enqueue(
            roomy,
            project,
            _webhook(),
            "refs/heads/main",
            commit,
            identity=commit,
            held_reason=HeldReason.FORK_PULL_REQUEST,
        )

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(deliver_once, commits * 4))

    assert sum(not r.duplicate for r in results) == 50
    assert len({r.job_id for r in results}) == 50
    created = _jobs(local_stack, project_id)
    assert len(created) == 50 and {job["status"]["S"] for job in created} == {"held"}
    # Cancelled, so that 50 queue slots are not kept from later tests on this stack.
    from relevo_core.jobs.cancel import cancel_job

    for job_id in {r.job_id for r in results}:
        assert cancel_job(roomy, job_id, "arn:aws:iam::123456789012:user/test")["was"] == "held"


def test_queue_full_refuses_with_429_and_writes_nothing(local_stack, intake_settings, project_id):
    """A job that would queue (its project's lock is held) is refused while the queue is full."""
    secret = register_project(local_stack, project_id, STAGES)
    limit = int(intake_settings.queue_limit)
    hold_outside(local_stack, project_id)
    # Past the limit, by ADD up and down: executions of earlier tests on this stack may still give
    # slots back meanwhile, and a reset to 0 afterwards would lose those (the counter would then
    # stand below the jobs really queued, and a later test's full queue would not be full).
    with queue_filled(local_stack, limit):
        body = push_body(f"acme/{project_id}", secrets.token_hex(20))
        response = deliver(
            local_stack, project_id, body, secret, **{"X-GitHub-Delivery": "full-" + secrets.token_hex(4)}
        )
        assert (response.status_code, response.json()["error"]) == (429, "QUEUE_FULL")
        assert _jobs(local_stack, project_id) == []
        assert table_items(local_stack, f"DEDUP#{project_id}:") == []
        assert table_items(local_stack, "DELIVERY#github#full-") == []
        assert lock_record(local_stack, project_id)["holders"] == {OUTSIDE_HOLDER}
    release_outside(local_stack, project_id)


def test_a_job_whose_project_is_free_runs_whatever_the_queue(local_stack, intake_settings, project_id):
    """A job that takes its project's free lock at intake is not queued: a full queue does not
    refuse it, and it takes no slot."""
    secret = register_project(local_stack, project_id, STAGES)
    with queue_filled(local_stack, int(intake_settings.queue_limit)):
        slots = QueueSlots(local_stack, project_id)
        body = push_body(f"acme/{project_id}", secrets.token_hex(20))
        response = deliver(local_stack, project_id, body, secret)
        assert response.status_code == 202, response.text
        job_id = response.json()["job_id"]
        record = job_record(local_stack, job_id)
        assert (record["status"], record["machine"]) == ("running", "run") and "start_pending" not in record
        assert lock_record(local_stack, project_id)["holders"] == {job_id}
        assert slots.change() == 0


def _running(stack, job_id: str) -> dict:
    """The job's record once it runs (its execution took the lock), or as it stands after 10 s."""
    try:
        return wait_until(
            lambda: (r := job_record(stack, job_id))["status"] == "running" and r, 10, "running"
        )
    except TimeoutError:
        return job_record(stack, job_id)


def _in_line(stack, job_id: str) -> None:
    try:
        wait_until(lambda: "waiting_for" in job_record(stack, job_id), 30, "in line")
    except TimeoutError:
        raise AssertionError(
            f"{job_id} not in line for its project's lock within 30 s: {job_record(stack, job_id)}"
        ) from None


def test_a_project_found_busy_queues_its_next_job_in_one_transaction_which_runs_once_the_lock_frees(
    local_stack, intake_settings, project_id
):
    """After the lock refused one of its jobs, the project's next job is written queued at once
    (intake.busy_projects), takes its slot, and waits for the lock like the one before it: the
    first in line takes the freed lock, and the second does not overtake it."""
    register_project(local_stack, project_id, STAGES)
    project = get_project(local_stack.table_name, project_id)
    slots = QueueSlots(local_stack, project_id)
    hold_outside(local_stack, project_id)
    first, second = (
        enqueue(intake_settings, project, _webhook(), "refs/heads/main", commit, identity=commit)
        for commit in (secrets.token_hex(20), secrets.token_hex(20))
    )
    assert busy_projects.seems_busy(local_stack.table_name, project_id)
    assert [job_record(local_stack, job.job_id)["status"] for job in (first, second)] == ["queued", "queued"]
    assert slots.change() == 2
    # Both in line first: order among waiters is the line's (wait_order); two executions that both
    # start after the release race for the free lock, whichever way their jobs were written.
    for job in (first, second):
        _in_line(local_stack, job.job_id)
    release_outside(local_stack, project_id)
    assert _running(local_stack, first.job_id)["status"] == "running"
    second_now = job_record(local_stack, second.job_id)
    assert lock_record(local_stack, project_id)["holders"] == {first.job_id}, second_now
    assert second_now["status"] != "running", second_now


def test_a_job_remembered_busy_whose_project_is_free_after_all_takes_the_lock_and_runs(
    local_stack, intake_settings, project_id
):
    """A memory gone stale (the lock freed since the refusal) costs the job its queued machine's
    turn at the free lock, nothing more: it runs at once, and its slot is given back."""
    register_project(local_stack, project_id, STAGES)
    project = get_project(local_stack.table_name, project_id)
    slots = QueueSlots(local_stack, project_id)
    busy_projects.found_busy(local_stack.table_name, project_id, 60)  # as after a refusal
    commit = secrets.token_hex(20)
    result = enqueue(intake_settings, project, _webhook(), "refs/heads/main", commit, identity=commit)
    assert job_record(local_stack, result.job_id)["status"] in ("queued", "running")
    record = _running(local_stack, result.job_id)
    assert record["status"] == "running" and "start_pending" not in record
    assert lock_record(local_stack, project_id)["holders"] == {result.job_id}
    assert slots.change() == 0  # taken at the enqueue, given back at the start


def test_a_job_remembered_busy_is_not_refused_for_a_full_queue_when_its_project_is_free(
    local_stack, intake_settings, project_id
):
    """A full queue refuses only a job that must wait: the lock is tried before QUEUE_FULL."""
    register_project(local_stack, project_id, STAGES)
    project = get_project(local_stack.table_name, project_id)
    busy_projects.found_busy(local_stack.table_name, project_id, 60)
    with queue_filled(local_stack, int(intake_settings.queue_limit)):
        slots = QueueSlots(local_stack, project_id)
        commit = secrets.token_hex(20)
        job_id = enqueue(
            intake_settings, project, _webhook(), "refs/heads/main", commit, identity=commit
        ).job_id
        assert not busy_projects.seems_busy(local_stack.table_name, project_id)  # it took the lock
        record = job_record(local_stack, job_id)
        assert (record["status"], record["machine"]) == ("running", "run")
        assert lock_record(local_stack, project_id)["holders"] == {job_id}
        assert slots.change() == 0


def test_a_replayed_delivery_id_is_recognised_and_not_processed_twice(local_stack, project_id):
    secret = register_project(local_stack, project_id, STAGES)
    delivery = "replay-" + secrets.token_hex(8)
    first = deliver(
        local_stack,
        project_id,
        push_body(f"acme/{project_id}", secrets.token_hex(20)),
        secret,
        **{"X-GitHub-Delivery": delivery},
    )

    # The same delivery id, even with another body (a replay GitHub signed again), is not new work.
    replay = deliver(
        local_stack,
        project_id,
        push_body(f"acme/{project_id}", secrets.token_hex(20)),
        secret,
        **{"X-GitHub-Delivery": delivery},
    )

    assert first.status_code == 202
    assert replay.status_code == 200
    assert replay.json() == {
        "job_id": first.json()["job_id"],
        "duplicate": True,
        "outcome": "replayed_delivery",
    }
    assert len(_jobs(local_stack, project_id)) == 1


@pytest.mark.parametrize(
    "on_repeat, expect_status, expect_new_job",
    [("hold", "held", True), ("skip", None, False), ("run", "queued", True)],
)
def test_a_repeat_after_the_window_follows_on_repeat(
    local_stack, intake_settings, project_id, on_repeat, expect_status, expect_new_job
):
    register_project(
        local_stack, project_id, STAGES, dedup={"webhook": {"window_sec": 120, "on_repeat": on_repeat}}
    )
    project = get_project(local_stack.table_name, project_id)
    window, _ = project.dedup_for("webhook")
    commit = secrets.token_hex(20)
    then = datetime.now(UTC) - timedelta(seconds=window + 5)
    first = enqueue(
        intake_settings, project, _webhook(), "refs/heads/main", commit, identity=commit, now=then
    )

    repeat = enqueue(intake_settings, project, _webhook(), "refs/heads/main", commit, identity=commit)
    again = enqueue(intake_settings, project, _webhook(), "refs/heads/main", commit, identity=commit)

    records = {j["job_id"]["S"]: j for j in _jobs(local_stack, project_id)}
    if expect_new_job:
        assert repeat.job_id != first.job_id and not repeat.duplicate
        assert records[repeat.job_id]["status"]["S"] in (
            {expect_status} if expect_status == "held" else {"queued", "running"}
        )
        # Inside the new window, a third delivery is a plain duplicate of the repeat.
        assert (again.job_id, again.duplicate) == (repeat.job_id, True)
        assert len(records) == 2
    else:
        assert (repeat.job_id, repeat.duplicate, repeat.outcome) == (first.job_id, True, "skipped")
        assert list(records) == [first.job_id]
    if on_repeat == "hold":
        with pytest.raises(client("stepfunctions").exceptions.ExecutionDoesNotExist):
            client("stepfunctions").describe_execution(
                executionArn=job_execution_arn(local_stack, repeat.job_id)
            )
        assert "start_pending" not in records[repeat.job_id]
        assert records[repeat.job_id]["held_reason"]["S"] == "repeat_after_window"


@pytest.mark.parametrize("on_repeat", ["run", "hold"])
def test_a_held_fork_pull_request_is_held_on_first_arrival_and_after_the_window(
    local_stack, intake_settings, project_id, on_repeat
):
    """A trigger intake is told to hold (a fork pull request) is written held on its first arrival,
    takes no queue slot and starts nothing; repeated after its window it is held again, for the same
    reason, whatever on_repeat says. The queue is full throughout: a held job takes no slot."""
    register_project(
        local_stack, project_id, STAGES, dedup={"webhook": {"window_sec": 120, "on_repeat": on_repeat}}
    )
    project = get_project(local_stack.table_name, project_id)
    window, _ = project.dedup_for("webhook")
    commit = secrets.token_hex(20)
    then = datetime.now(UTC) - timedelta(seconds=window + 5)

    with queue_filled(local_stack, intake_settings.queue_limit):
        first = enqueue(
            intake_settings,
            project,
            _webhook(),
            "refs/pull/7/head",
            commit,
            identity=commit,
            now=then,
            held_reason=HeldReason.FORK_PULL_REQUEST,
        )
        repeat = enqueue(
            intake_settings,
            project,
            _webhook(),
            "refs/pull/7/head",
            commit,
            identity=commit,
            held_reason=HeldReason.FORK_PULL_REQUEST,
        )

    assert (first.outcome, first.duplicate, repeat.outcome, repeat.duplicate) == (
        "held",
        False,
        "held",
        False,
    )
    assert repeat.job_id != first.job_id
    records = {j["job_id"]["S"]: j for j in _jobs(local_stack, project_id)}
    assert {job_id: (r["status"]["S"], r["held_reason"]["S"]) for job_id, r in records.items()} == {
        first.job_id: ("held", "fork_pull_request"),
        repeat.job_id: ("held", "fork_pull_request"),
    }
    assert not any("start_pending" in record for record in records.values())
    for job_id in records:
        with pytest.raises(client("stepfunctions").exceptions.ExecutionDoesNotExist):
            client("stepfunctions").describe_execution(executionArn=job_execution_arn(local_stack, job_id))


def _written_not_started(stack, settings, project_id, written_at: datetime, queued: bool):
    """A job written as intake writes it, never started (intake died between its two calls): one
    that queued (its project's lock held meanwhile), or one that took the free lock."""
    from relevo_core.intake.enqueue import build_envelope, idempotency_key

    project_cache.clear()
    project = get_project(stack.table_name, project_id)
    commit = secrets.token_hex(20)
    stages = project.frozen_stages()
    envelope = build_envelope(
        settings,
        project,
        _webhook(),
        "refs/heads/main",
        commit,
        stages,
        idempotency_key(project.id, commit, stages),
        written_at,
    )
    if queued:
        hold_outside(stack, project_id)
    created = job_creation.create_job(stack.table_name, envelope, 3600, 10_000, written_at)
    assert isinstance(created, job_creation.Created) and created.took_lock is not queued
    if queued:
        release_outside(stack, project_id)
    return envelope


def test_a_job_that_took_its_projects_lock_and_was_never_started_is_started_by_the_sweep(
    local_stack, intake_settings, project_id
):
    """It carries no start marker: the sweep finds it holding the lock with no execution. Younger
    than MIN_AGE it is left alone, lock and all (intake is starting it); older, it is started on the
    common machine and keeps the lock; a second sweep starts nothing."""
    register_project(local_stack, project_id, STAGES)
    young = _written_not_started(local_stack, intake_settings, project_id, datetime.now(UTC), queued=False)
    report = sweep(intake_settings, datetime.now(UTC))
    assert young.job_id not in report.started and not any(project_id in f for f in report.locks_freed)
    assert lock_record(local_stack, project_id)["holders"] == {young.job_id}

    report = sweep(intake_settings, datetime.now(UTC) + timedelta(minutes=1))

    assert young.job_id in report.started and not any(project_id in f for f in report.locks_freed)
    described = client("stepfunctions").describe_execution(
        executionArn=local_stack.state_machine_arn.replace(":stateMachine:", ":execution:")
        + f":{young.job_id}"
    )
    assert (described["name"], described["status"]) == (young.job_id, "RUNNING")
    assert lock_record(local_stack, project_id)["holders"] == {young.job_id}
    assert young.job_id not in sweep(intake_settings, datetime.now(UTC) + timedelta(minutes=1)).started
    receive_stage(local_stack, young.job_id)  # its first stage is dispatched


def test_a_job_whose_execution_never_started_is_started_by_the_sweep(
    local_stack, intake_settings, project_id
):
    """Given a queued job written but never started, when the sweep runs, then its execution
    exists under the job id (on the queued machine); a second sweep starts nothing."""
    register_project(local_stack, project_id, STAGES)
    written_at = datetime.now(UTC) - timedelta(minutes=1)
    envelope = _written_not_started(local_stack, intake_settings, project_id, written_at, queued=True)

    report = start_forgotten_jobs(intake_settings, datetime.now(UTC))

    assert envelope.job_id in report.started
    described = client("stepfunctions").describe_execution(
        executionArn=job_execution_arn(local_stack, envelope.job_id)
    )
    assert described["name"] == envelope.job_id
    import time

    for _ in range(50):  # the execution's first state clears the sweeper's marker
        if envelope.job_id not in start_forgotten_jobs(intake_settings, datetime.now(UTC)).already_running:
            break
        time.sleep(0.1)
    assert envelope.job_id not in start_forgotten_jobs(intake_settings, datetime.now(UTC)).started


def test_the_execution_returns_the_queue_slot_exactly_once(local_stack, intake_settings, project_id):
    """A job that queued (its project busy at intake) gives its slot back once it starts."""
    register_project(local_stack, project_id, STAGES)
    project = get_project(local_stack.table_name, project_id)
    slots = QueueSlots(local_stack, project_id)
    commit = secrets.token_hex(20)

    hold_outside(local_stack, project_id)
    result = enqueue(intake_settings, project, _webhook(), "refs/heads/main", commit, identity=commit)
    assert slots.change() == 1
    release_outside(local_stack, project_id)

    import time

    for _ in range(50):
        record = {i["sk"]["S"]: i for i in table_items(local_stack, f"JOB#{result.job_id}")}["JOB"]
        if record["status"]["S"] == "running":
            break
        time.sleep(0.1)
    assert record["status"]["S"] == "running"
    assert "start_pending" not in record
    assert slots.change() == -1  # given back once at the start, the one taken at the enqueue


def test_unknown_stage_in_a_run_request_is_refused(local_stack, intake_settings, project_id):
    register_project(local_stack, project_id, STAGES)
    from relevo_core.intake.triggers import run_project

    with pytest.raises(RelevoError) as refused:
        run_project(
            intake_settings,
            project_id,
            {"ref": "main", "stages": ["deploy"]},
            "arn:aws:iam::123456789012:user/ops",
        )
    assert refused.value.code is ErrorCode.STAGE_UNKNOWN
    assert _jobs(local_stack, project_id) == []
