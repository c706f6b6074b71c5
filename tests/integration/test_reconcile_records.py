"""What reconciliation reads and writes on a stage record, fenced on the attempt like every
other agent write (DynamoDB on the embedded stack)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts
from relevo_core.store.codec import from_attributes
from tests.helpers.stack import job_items, receive_stage
from tests.helpers.state_machine import start_job, wait_for_run_token


def _stage(stack, job_id):
    return {i["sk"]["S"]: from_attributes(i) for i in job_items(stack, job_id)}["STAGE#00"]


def test_a_claim_returns_what_the_previous_attempt_left_and_reconciliation_is_fenced(local_stack, project_id):
    job_id = start_job(local_stack, project_id, stages=[{"name": "upload", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    now = datetime.now(UTC)
    first = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-a")
    second = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-b")

    assert "attempt" not in stage_attempts.claim(first, 10, now, "commit=a;inputs=0")
    # mac-a's attempt ends without a receipt it could deliver: the next claim sees no outcome.
    previous = stage_attempts.claim(second, 10, now, "commit=a;inputs=0")

    assert (previous["attempt"], previous["agent_id"], previous["precondition_version"]) == (
        1,
        "mac-a",
        "commit=a;inputs=0",
    )
    assert stage_attempts.needs_reconcile(previous, 2)
    stage_attempts.record_reconciled(second, "rerun", {"probe_exit": 1}, now)
    with pytest.raises(stage_attempts.LeaseLost):
        stage_attempts.record_reconciled(first, "succeeded", {"probe_exit": 0}, now)
    stage_attempts.finish(
        second, StageStatus.SUCCEEDED, now, 0, None, receipt={"exit_code": 0, "artifacts": {}}
    )

    stage = _stage(local_stack, job_id)
    assert (stage["status"], stage["outcome"], stage["receipt"]) == (
        "succeeded",
        "succeeded",
        {"exit_code": 0, "artifacts": {}},
    )
    assert [(r["attempt"], r["decision"]) for r in stage["reconciliations"]] == [(2, "rerun")]
    assert stage["reconciled"]["evidence"] == {"probe_exit": 1}
    # The job view (GET /jobs/{id}) shows every reconciliation with its evidence (the console's steps)
    viewed = RelevoApi.for_stack(local_stack).get_job(job_id)["stages"][0]
    assert [(r["attempt"], r["decision"], r["evidence"]) for r in viewed["reconciliations"]] == [
        (2, "rerun", {"probe_exit": 1})
    ]
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_a_killed_attempt_is_recorded_with_an_unknown_outcome(local_stack, project_id):
    job_id = start_job(local_stack, project_id, stages=[{"name": "upload", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    now = datetime.now(UTC)
    first = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-a")
    stage_attempts.claim(first, 10, now)

    stage_attempts.finish(
        first,
        StageStatus.FAILED,
        now,
        -1,
        "Relevo.Transient.AgentShutdown",
        outcome=stage_attempts.AttemptOutcome.UNKNOWN,
    )

    previous = stage_attempts.claim(
        stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-b"), 10, now
    )
    assert previous["outcome"] == "unknown" and "receipt" not in previous
    assert stage_attempts.needs_reconcile(previous, 2)
    assert "outcome" not in _stage(local_stack, job_id)  # the new attempt starts clean
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_the_attempts_an_agent_holds_are_listed_until_it_finishes_them(local_stack, project_id):
    job_id = start_job(local_stack, project_id, stages=[{"name": "upload", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    now = datetime.now(UTC)
    agent = "mac-" + project_id
    ref = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, agent)
    stage_attempts.claim(ref, 10, now, journal_id="journal-" + project_id)

    # With the journal it was claimed from: HeldByIndex, which it replaced, did not project
    # journal_id, so a restarted agent never recognised its own claims (issue 28).
    [held] = stage_attempts.held_by(local_stack.table_name, agent)
    assert held == stage_attempts.HeldAttempt(
        job_id=job_id, stage_index=0, stage_name="upload", attempt=1, journal_id="journal-" + project_id
    )

    stage_attempts.finish(ref, StageStatus.FAILED, now, 2, "Relevo.Fatal.ExitCode")
    assert stage_attempts.held_by(local_stack.table_name, agent) == []
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_a_restarted_agent_reports_at_once_what_its_journal_claimed_with_credentials_asked_for_again(
    local_stack, project_id, tmp_path
):
    """Restart recovery (relevo_agent.restart): the journal begins an operation, with its claim
    secret, before the claim is sent, so a restarted agent knows every attempt it may hold. The
    one in flight is reported interrupted at once, with the job credentials the claim route gives
    again for that secret (the process that held them is gone), so the retry comes well inside
    the lease instead of after it."""
    from relevo_agent.claim import new_claim_secret
    from relevo_agent.claim_routes import ClaimRoutes
    from relevo_agent.job_sessions import JobSessions
    from relevo_agent.journal import Journal, Operation, operation_id
    from relevo_agent.outbox import Outbox
    from relevo_agent.restart import recover
    from relevo_agent.stop import AgentStop
    from relevo_core.models.agent_session import ClaimRequest

    job_id = start_job(local_stack, project_id, stages=[{"name": "upload", "run": "true"}], lease_ttl_sec=120)
    task, _ = receive_stage(local_stack, job_id)
    journal = Journal(tmp_path / "mac.sqlite3")
    agent, secret = "mac-" + project_id, new_claim_secret()
    routes = ClaimRoutes(local_stack.api_url, "eu-west", local_stack.region)
    journal.begin(
        Operation(
            operation_id(job_id, "upload"), job_id, "upload", 0, 1, str(tmp_path), "", claim_secret=secret
        )
    )
    # The route answers the dispatch with the claim: the state machine hands it its run token.
    assert (
        routes.claim(
            ClaimRequest(
                job_id=job_id,
                stage_index=0,
                attempt=1,
                agent_id=agent,
                claim_secret=secret,
                dispatch_key=task["dispatch_key"],
                dispatch_token=task["task_token"],
            )
        ).accepted
        is True
    )
    wait_for_run_token(stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, agent))

    # A new process: no credentials held, only the journal.
    sessions = JobSessions(routes, agent)
    recover(journal, Outbox(journal, local_stack.table_name, agent, AgentStop(), sessions))

    retry, _ = receive_stage(local_stack, job_id, timeout=30)  # the lease has 120 s to go
    assert retry["attempt"] == 2
    assert journal.pending() == [] and sessions.held() == []
    assert stage_attempts.held_by(local_stack.table_name, agent) == []
    view = RelevoApi.for_stack(local_stack).get_job(job_id)
    assert [entry["error"] for entry in view["stages"][0]["attempts_log"]] == [
        "Relevo.Transient.AgentShutdown"
    ]
    client("stepfunctions").send_task_failure(taskToken=retry["task_token"], error="Test.Cleanup", cause="")
