"""What the plain CLI says after the things a first day trips over (issue 42): an upload whose Mac
was killed and whose next attempt found its effect (`relevo job view`, `relevo job logs`), the
commit a run without one resolved at its first checkout (`relevo job list`), and a rejection
(`relevo job logs`, `relevo dlq list`).

The stages are run the way relevo-agent runs them (claim, accept, record, report), without agent
processes, against the embedded stack."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_cli.api import RelevoApi
from relevo_cli.commands.common import console
from relevo_cli.main import app
from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts
from tests.helpers.stack import receive_stage, register_project, wait_for_execution, wait_until
from tests.helpers.state_machine import agent_runs, claim_and_accept, wait_for_run_token

runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI's console took its width when it was created; wide enough that no table cell wraps.
    monkeypatch.setattr(console, "width", 250)


def _stack_file(local_stack, tmp_path: Path) -> str:
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(local_stack.model_dump()))
    return str(path)


def _cli(stack_file: str, *args: str, exit_code: int = 0) -> str:
    result = runner.invoke(app, [*args, "--stack-file", stack_file])
    assert result.exit_code == exit_code, result.output
    return result.stdout


def test_a_reconciled_upload_is_said_reconciled_by_job_view_and_job_logs(
    local_stack,
    project_id,
    tmp_path: Path,
):
    # Given a run without a commit whose upload's first Mac was killed after its first checkout
    register_project(
        local_stack,
        project_id,
        [{"name": "upload", "run": "upload", "effect_probe": "probe"}],
        retry={"backoff_base_sec": 0},
    )
    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(local_stack, job_id)
    first = claim_and_accept(local_stack, task, "mac-t2")
    first_token = wait_for_run_token(first)
    stage_attempts.record_checkout_commit(first, secrets.token_hex(20))
    stage_attempts.finish(
        first,
        StageStatus.FAILED,
        datetime.now(UTC),
        -1,
        "Relevo.Transient.AgentShutdown",
        outcome=stage_attempts.AttemptOutcome.UNKNOWN,
    )
    client("stepfunctions").send_task_failure(
        taskToken=first_token,
        error="Relevo.Transient.AgentShutdown",
        cause=json.dumps({"agent_id": "mac-t2"}),
    )

    # When attempt 2 reconciles (the probe finds attempt 1's effect) and reports, as the agent does
    retry, _ = receive_stage(local_stack, job_id, timeout=30)
    second = claim_and_accept(local_stack, retry, "mac-t1")
    second_token = wait_for_run_token(second)
    evidence = {
        "previous_attempt": 1,
        "previous_agent": "mac-t2",
        "precondition_before": None,
        "precondition_now": "commit=x",
        "probe_exit": 0,
        "probe_output": "uploaded",
    }
    stage_attempts.record_reconciled(second, "succeeded", evidence, datetime.now(UTC))
    stage_attempts.finish(
        second,
        StageStatus.SUCCEEDED,
        datetime.now(UTC),
        0,
        None,
        receipt={"reconciled": True, "exit_code": 0},
    )
    client("stepfunctions").send_task_success(
        taskToken=second_token, output=json.dumps({"agent_id": "mac-t1"})
    )
    wait_until(lambda: api.get_job(job_id)["status"] == "succeeded", 30, f"{job_id} succeeded")

    # Then `relevo job view` says reconciled, with the probe's verdict and the attempt that did it
    said = "upload#2 reconciled on mac-t1: the effect of attempt 1 exists (probe exit 0); not run again"
    viewed = _cli(stack_file, "job", "view", job_id)
    [row] = [line for line in viewed.splitlines() if line.startswith("│") and " upload " in line]
    assert "reconciled" in row and "succeeded" not in row, viewed
    assert said in viewed.splitlines(), viewed
    # and `relevo job logs` ends the stage with it
    assert f"── {said} ──" in _cli(stack_file, "job", "logs", job_id).splitlines()


def test_the_job_list_shows_the_commit_a_run_without_one_resolved_at_its_first_checkout(
    local_stack, project_id, tmp_path: Path
):
    # Given a run without a commit whose first stage checked out main
    register_project(local_stack, project_id, [{"name": "build", "run": "make"}])
    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(local_stack, job_id)
    ref = claim_and_accept(local_stack, task, "mac-t1")
    run_token = wait_for_run_token(ref)
    commit = secrets.token_hex(20)
    stage_attempts.record_checkout_commit(ref, commit)

    # Then `relevo job list` shows the commit its first checkout resolved, in its table and its JSON
    [listed] = [
        job
        for job in json.loads(_cli(stack_file, "job", "list", "--project", project_id, "--json"))["jobs"]
        if job["job_id"] == job_id
    ]
    assert (listed["commit"], listed["commit_source"]) == (commit, "checkout"), listed
    assert f"main @ {commit[:8]}" in _cli(stack_file, "job", "list", "--project", project_id)
    client("stepfunctions").send_task_failure(taskToken=run_token, error="Test.Cleanup", cause="")


def _rejected(local_stack, project_id: str, stack_file: str) -> str:
    """A job rejected at its approval gate before deploy (`relevo job reject`), once its execution ended."""
    register_project(
        local_stack,
        project_id,
        [{"name": "build", "run": "make"}, {"name": "deploy", "run": "ship"}],
        approval={"enabled": True},
    )
    api = RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(local_stack, job_id)
    agent_runs(local_stack, task)
    wait_until(lambda: api.get_job(job_id)["status"] == "waiting", 30, f"{job_id} waiting")

    _cli(stack_file, "job", "reject", job_id, "--reason", "crash on launch in QA")
    wait_for_execution(local_stack, job_id)
    return job_id


def test_a_rejection_is_said_by_job_logs_with_who_rejected_and_why(local_stack, project_id, tmp_path: Path):
    # Given a job a person rejected at its approval gate
    stack_file = _stack_file(local_stack, tmp_path)
    job_id = _rejected(local_stack, project_id, stack_file)
    me = client("sts").get_caller_identity()["Arn"]

    # Then its log says who rejected deploy and why, not only that it was skipped
    logs = _cli(stack_file, "job", "logs", job_id).splitlines()
    assert f"── deploy skipped: rejected by {me} at its approval gate: crash on launch in QA ──" in logs, logs


def test_a_rejection_stays_out_of_the_dead_letter_queue(local_stack, project_id, tmp_path: Path):
    # Given a job a person rejected at its approval gate
    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    job_id = _rejected(local_stack, project_id, stack_file)

    # Then no dead-letter entry stands beside the real failures: nothing is there to redrive
    entries = json.loads(_cli(stack_file, "dlq", "list", "--json"))["entries"]
    assert job_id not in [entry["job_id"] for entry in entries]
    refused = runner.invoke(app, ["dlq", "view", job_id, "--stack-file", stack_file])
    assert refused.exit_code == 1 and "DLQ_ENTRY_NOT_FOUND" in refused.output, refused.output
    assert api.get_job(job_id)["error"] == "Relevo.Approval.Rejected"
