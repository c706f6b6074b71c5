"""Three timeouts under their own names, and classified retries with recorded backoff, decided by
job.asl.json on the embedded stack (timeouts and backoffs come from the plan, kept short here)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts
from relevo_core.store.codec import from_attributes
from tests.helpers.stack import job_items, receive_stage, wait_for_execution
from tests.helpers.state_machine import agent_runs, claim_and_accept, start_job, wait_for_run_token


def _records(stack, job_id):
    return {item["sk"]["S"]: from_attributes(item) for item in job_items(stack, job_id)}


def test_no_agent_claims_in_time_is_a_queue_timeout(local_stack, project_id):
    job_id = start_job(
        local_stack, project_id, stages=[{"name": "build", "run": "true"}], queue_timeout_sec=2
    )

    described = wait_for_execution(local_stack, job_id, timeout=30)

    assert (described["status"], described.get("error")) == ("FAILED", "Relevo.Timeout.Queue")
    job = _records(local_stack, job_id)["JOB"]
    assert job["error_name"] == "Relevo.Timeout.Queue" and job.get("last_successful_stage") is None


def test_a_transient_failure_is_retried_with_backoff_and_recorded(local_stack, project_id):
    job_id = start_job(
        local_stack,
        project_id,
        stages=[{"name": "upload", "run": "true"}],
        retry={"backoff_base_sec": 2, "max_delay_sec": 2},
    )
    first, _ = receive_stage(local_stack, job_id)
    agent_runs(local_stack, first, succeed=False, agent_id="mac-a", error="Relevo.Transient.ExitCode")

    second, _ = receive_stage(local_stack, job_id, timeout=20)
    assert second["attempt"] == 2
    agent_runs(local_stack, second, agent_id="mac-b")

    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    stage = _records(local_stack, job_id)["STAGE#00"]
    assert (stage["status"], stage["agent_id"], stage["attempt"], stage["retry_count"]) == (
        "succeeded",
        "mac-b",
        2,
        1,
    )
    # Full jitter up to min(2, 2 * 2^0): AWS draws below the cap, the emulator up to it inclusive.
    assert 0 <= stage["cumulative_backoff_sec"] <= 2
    assert [(a["attempt"], a["error"]) for a in stage["attempts_log"]] == [(1, "Relevo.Transient.ExitCode")]


def test_retries_stop_at_the_plans_attempts_for_the_class(local_stack, project_id):
    job_id = start_job(
        local_stack,
        project_id,
        stages=[{"name": "upload", "run": "true"}],
        retry={"backoff_base_sec": 0, "attempts": {"Relevo.Transient.NetworkTimeout": 2}},
    )
    for attempt in (1, 2):
        task, _ = receive_stage(local_stack, job_id, timeout=20)
        assert task["attempt"] == attempt
        agent_runs(local_stack, task, succeed=False, error="Relevo.Transient.NetworkTimeout")

    described = wait_for_execution(local_stack, job_id)
    assert (described["status"], described["error"]) == ("FAILED", "Relevo.Transient.NetworkTimeout")
    assert _records(local_stack, job_id)["STAGE#00"]["retry_count"] == 1


def test_an_agent_that_stops_heartbeating_loses_its_lease_and_the_stage_moves(local_stack, project_id):
    job_id = start_job(
        local_stack,
        project_id,
        stages=[{"name": "sign", "run": "true"}],
        lease_ttl_sec=3,
        retry={"backoff_base_sec": 0},
    )
    task, _ = receive_stage(local_stack, job_id)
    ref = claim_and_accept(local_stack, task, "mac-dead", lease_ttl_sec=3)
    wait_for_run_token(ref)  # ...and then the agent goes silent

    retry, _ = receive_stage(local_stack, job_id, timeout=30)

    assert retry["attempt"] == 2
    stage = _records(local_stack, job_id)["STAGE#00"]
    assert [a["error"] for a in stage["attempts_log"]] == ["Relevo.Lease.Expired"]
    agent_runs(local_stack, retry, agent_id="mac-alive")
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    # The zombie's late report is refused: it no longer holds the attempt.
    import pytest

    with pytest.raises(stage_attempts.LeaseLost):
        stage_attempts.finish(ref, StageStatus.SUCCEEDED, datetime.now(UTC), 0, None)


def test_a_live_agent_past_the_exec_backstop_is_an_exec_timeout_not_a_lease_loss(local_stack, project_id):
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

    def heartbeat():  # alive and renewing, but never ending the command
        while not stop.wait(1):
            try:
                stage_attempts.renew_lease(ref, 3, datetime.now(UTC))
                client("stepfunctions").send_task_heartbeat(taskToken=token)
            except Exception:
                return

    beats = threading.Thread(target=heartbeat, daemon=True)
    beats.start()
    try:
        described = wait_for_execution(local_stack, job_id, timeout=30)
    finally:
        stop.set()
    assert (described["status"], described["error"]) == ("FAILED", "Relevo.Timeout.Exec")
