"""Issue 14, point 4: a stage's timeout is classified by what happened, on the state machine's
own clock, never by comparing the lease an agent wrote with the state machine's time.

- A heartbeat lapse (HeartbeatSeconds = lease_ttl_sec) is a lost lease: Relevo.Lease.Expired,
  retried. AWS names it States.HeartbeatTimeout and a Catch on that name matches it before one on
  States.Timeout ("Error handling in Step Functions", error names; catchers are scanned in order).
- The backstop (TimeoutSeconds = exec + kill grace + lease, from the claim's run token on) is an
  exec timeout: the agent kept heartbeating past exec_timeout_sec without ending the command.
- A stage of a job that failed is left `failed`, never `running`.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from relevo_core.aws import client
from relevo_core.store import stage_attempts
from relevo_core.store.codec import from_attributes
from tests.helpers.stack import history, job_items, receive_stage, wait_for_execution
from tests.helpers.state_machine import agent_runs, claim_and_accept, start_job, wait_for_run_token


def _stage(stack, job_id, sk: str = "STAGE#00") -> dict:
    return {item["sk"]["S"]: from_attributes(item) for item in job_items(stack, job_id)}[sk]


def _renewing(
    ref: stage_attempts.StageRef, lease_ttl_sec: int, token: str | None, stop: threading.Event
) -> threading.Thread:
    """An agent whose lease renewals land every second; its heartbeats only when `token` is given."""

    def loop() -> None:
        while not stop.wait(1):
            try:
                stage_attempts.renew_lease(ref, lease_ttl_sec, datetime.now(UTC))
                if token:
                    client("stepfunctions").send_task_heartbeat(taskToken=token)
            except Exception:
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _claimed_then_silent(stack, project_id: str, agent_id: str) -> str:
    """A one-attempt job whose stage an agent claims and then never heartbeats."""
    job_id = start_job(
        stack,
        project_id,
        stages=[{"name": "deliver", "run": "true"}],
        lease_ttl_sec=3,
        retry={"backoff_base_sec": 0, "attempts": {"Relevo.Lease.Expired": 1}},
    )
    task, _ = receive_stage(stack, job_id)
    wait_for_run_token(claim_and_accept(stack, task, agent_id, lease_ttl_sec=3))
    return job_id


def test_a_heartbeat_lapse_with_a_live_lease_is_a_lost_lease_and_is_retried(local_stack, project_id):
    # The partition of the issue: the renewal landed just before the cut, the heartbeat did not.
    job_id = start_job(
        local_stack,
        project_id,
        stages=[{"name": "deliver", "run": "true", "exec_timeout_sec": 120}],
        lease_ttl_sec=3,
        retry={"backoff_base_sec": 0},
    )
    task, _ = receive_stage(local_stack, job_id)
    ref = claim_and_accept(local_stack, task, "mac-cut-off", lease_ttl_sec=3)
    wait_for_run_token(ref)
    stop = threading.Event()
    _renewing(ref, 3, None, stop)
    try:
        retry, _ = receive_stage(local_stack, job_id, timeout=30)
    finally:
        stop.set()

    assert retry["attempt"] == 2
    assert [entry["error"] for entry in _stage(local_stack, job_id)["attempts_log"]] == [
        "Relevo.Lease.Expired"
    ]
    agent_runs(local_stack, retry, agent_id="mac-alive")
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"


def test_the_heartbeat_lapse_is_caught_by_its_own_name(local_stack, project_id):
    """The emulator reports a heartbeat lapse the way AWS names it (the local stack's patch of
    moto 5.2.5, which says States.Timeout): the Catch on States.HeartbeatTimeout decides."""
    job_id = _claimed_then_silent(local_stack, project_id, "mac-silent")

    described = wait_for_execution(local_stack, job_id, timeout=30)

    assert (described["status"], described["error"]) == ("FAILED", "Relevo.Lease.Expired")
    timed_out = [e for e in history(local_stack, job_id) if e["type"] == "TaskTimedOut"]
    assert [e["taskTimedOutEventDetails"]["error"] for e in timed_out] == ["States.HeartbeatTimeout"]


def test_a_job_failed_by_a_timeout_leaves_its_stage_failed(local_stack, project_id):
    job_id = _claimed_then_silent(local_stack, project_id, "mac-gone")

    assert wait_for_execution(local_stack, job_id, timeout=30)["status"] == "FAILED"

    stage = _stage(local_stack, job_id)
    assert stage["status"] == "failed"
    assert "held_by" not in stage  # a restarted mac-gone does not find it among the attempts it holds


def test_a_live_agent_past_the_backstop_is_an_exec_timeout_and_its_stage_is_failed(local_stack, project_id):
    job_id = start_job(
        local_stack,
        project_id,
        stages=[{"name": "build", "run": "true", "exec_timeout_sec": 1, "kill_grace_sec": 0}],
        lease_ttl_sec=3,
    )
    task, _ = receive_stage(local_stack, job_id)
    ref = claim_and_accept(local_stack, task, "mac-stuck", lease_ttl_sec=3)
    token = wait_for_run_token(ref)
    stop = threading.Event()
    _renewing(ref, 3, token, stop)
    try:
        described = wait_for_execution(local_stack, job_id, timeout=30)
    finally:
        stop.set()

    assert (described["status"], described["error"]) == ("FAILED", "Relevo.Timeout.Exec")
    assert _stage(local_stack, job_id)["status"] == "failed"


def test_a_late_claim_of_a_stage_its_job_failed_is_refused_and_the_stage_stays_failed(
    local_stack, project_id
):
    """The queue timed out (no agent came); an agent that comes online later still receives the
    message: its claim must not bring the failed job's stage back to `running`."""
    import pytest

    job_id = start_job(
        local_stack, project_id, stages=[{"name": "deliver", "run": "true"}], queue_timeout_sec=2
    )
    assert wait_for_execution(local_stack, job_id, timeout=30)["error"] == "Relevo.Timeout.Queue"
    task, _ = receive_stage(local_stack, job_id)

    late = stage_attempts.StageRef(
        local_stack.table_name, job_id, task["stage_index"], task["attempt"], "mac-late"
    )
    with pytest.raises(stage_attempts.ClaimRefused) as refused:
        stage_attempts.claim(late, 3, datetime.now(UTC))

    assert not refused.value.held  # stale: the agent deletes the message
    assert _stage(local_stack, job_id)["status"] == "failed"
