"""Manual review on job.asl.json: a stage whose reconciliation could not tie an effect to its
operation waits for an operator (the token kept on the stage record), without failing or timing
out, and `POST /jobs/{id}/stages/{stage}/resolve` finishes it as succeeded, retry or failed."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts
from relevo_core.store.audit import actions
from relevo_core.store.codec import from_attributes
from tests.helpers.stack import job_items, receive_stage, wait_for_execution
from tests.helpers.state_machine import agent_runs, claim_and_accept, start_job, wait_for_run_token

STAGES = [
    {"name": "upload", "run": "upload.sh", "effect_probe": "probe.sh"},
    {"name": "notify", "run": "true"},
]


def _stage(stack, job_id, sk="STAGE#00"):
    return {i["sk"]["S"]: from_attributes(i) for i in job_items(stack, job_id)}[sk]


def _to_manual_review(stack, project_id) -> str:
    """An agent reconciles the stage's second attempt and finds an effect it cannot tie to it."""
    job_id = start_job(stack, project_id, stages=STAGES, lease_ttl_sec=3)
    task, _ = receive_stage(stack, job_id)
    ref = claim_and_accept(stack, task, "mac-a", lease_ttl_sec=3)
    token = wait_for_run_token(ref)
    now = datetime.now(UTC)
    stage_attempts.record_reconciled(ref, "manual_review", {"probe_exit": 0, "probe_output": "build 41"}, now)
    stage_attempts.finish(
        ref,
        StageStatus.MANUAL_REVIEW,
        now,
        None,
        "Relevo.Reconcile.ManualReview",
        outcome=stage_attempts.AttemptOutcome.MANUAL_REVIEW,
    )
    client("stepfunctions").send_task_failure(
        taskToken=token, error="Relevo.Reconcile.ManualReview", cause="{}"
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stage = _stage(stack, job_id)
        if stage.get("status") == "manual_review" and stage.get("review_attempt"):
            return job_id
        time.sleep(0.1)
    raise TimeoutError("the stage never waited for review")


def test_a_stage_in_manual_review_waits_longer_than_its_lease_and_resolves_as_succeeded(
    local_stack, project_id
):
    job_id = _to_manual_review(local_stack, project_id)
    api = RelevoApi.for_stack(local_stack)

    time.sleep(4)  # longer than the lease (3 s): the wait is not a heartbeat wait, nothing times out
    job = api.get_job(job_id)
    assert job["status"] == "running" and job["current_stage"] == "upload"
    assert job["stages"][0]["status"] == "manual_review"
    assert job["stages"][0]["reconciled"]["decision"] == "manual_review"

    result = api.resolve_stage(job_id, "upload", "succeeded", "checked build 41 by hand")

    assert result["resolution"] == "succeeded"
    task, _ = receive_stage(local_stack, job_id)
    assert task["stage"] == "notify"  # nothing of upload runs again
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    stage = _stage(local_stack, job_id)
    assert (stage["status"], stage["outcome"], stage["resolution"]["as"]) == (
        "succeeded",
        "resolved",
        "succeeded",
    )
    assert [a["action"] for a in actions(local_stack.table_name, job_id)] == ["stage.resolve"]
    with pytest.raises(ApiError) as refused:
        api.resolve_stage(job_id, "upload", "retry")
    assert (refused.value.status, refused.value.code) == (409, "STAGE_NOT_IN_REVIEW")


def test_resolved_as_retry_runs_a_new_attempt_of_the_same_operation(local_stack, project_id):
    job_id = _to_manual_review(local_stack, project_id)

    RelevoApi.for_stack(local_stack).resolve_stage(job_id, "upload", "retry")

    task, _ = receive_stage(local_stack, job_id)
    assert (task["stage"], task["attempt"]) == ("upload", 2)
    ref = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-b")
    previous = stage_attempts.claim(ref, 5, datetime.now(UTC))
    # The operator decided: the next attempt runs without reconciling again.
    assert previous["outcome"] == "resolved" and not stage_attempts.needs_reconcile(previous, 2)
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_resolved_as_failed_fails_the_job_with_its_own_error(local_stack, project_id):
    job_id = _to_manual_review(local_stack, project_id)
    api = RelevoApi.for_stack(local_stack)
    with pytest.raises(ApiError) as no_reason:
        api.resolve_stage(job_id, "upload", "failed")
    assert (no_reason.value.status, no_reason.value.code) == (422, "VALIDATION_FAILED")

    api.resolve_stage(job_id, "upload", "failed", "the effect belongs to another release")

    described = wait_for_execution(local_stack, job_id)
    assert (described["status"], described["error"]) == ("FAILED", "Relevo.Reconcile.ResolvedFailed")


def test_resolve_refuses_a_stage_that_is_not_in_review_and_an_unknown_stage(local_stack, project_id):
    job_id = start_job(local_stack, project_id, stages=STAGES)
    api = RelevoApi.for_stack(local_stack)

    for stage, expected in (("upload", (409, "STAGE_NOT_IN_REVIEW")), ("deploy", (422, "STAGE_UNKNOWN"))):
        with pytest.raises(ApiError) as refused:
            api.resolve_stage(job_id, stage, "succeeded")
        assert (refused.value.status, refused.value.code) == expected
    with pytest.raises(ApiError) as bad:
        api.resolve_stage(job_id, "upload", "maybe")
    assert (bad.value.status, bad.value.code) == (422, "VALIDATION_FAILED")
    task, _ = receive_stage(local_stack, job_id)
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_the_cli_resolves_and_prints_a_refusal_with_its_code(local_stack, project_id, tmp_path):
    from typer.testing import CliRunner

    from relevo_cli.main import app
    from tests.integration.test_cli import _stack_file

    runner = CliRunner()
    stack_file = _stack_file(local_stack, tmp_path)
    job_id = _to_manual_review(local_stack, project_id)

    resolved = runner.invoke(
        app, ["job", "resolve", job_id, "--stage", "upload", "--as", "retry", "--stack-file", stack_file]
    )
    again = runner.invoke(
        app, ["job", "resolve", job_id, "--stage", "upload", "--as", "retry", "--stack-file", stack_file]
    )
    unknown = runner.invoke(
        app, ["job", "resolve", job_id, "--stage", "upload", "--as", "maybe", "--stack-file", stack_file]
    )

    assert resolved.exit_code == 0 and "resolved as retry" in resolved.output, resolved.output
    assert again.exit_code == 1 and "STAGE_NOT_IN_REVIEW" in again.output
    assert unknown.exit_code == 2
    task, _ = receive_stage(local_stack, job_id)
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")
