"""The relevo CLI against the embedded stack (typer's runner, the real API underneath)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from relevo_cli.main import app
from tests.helpers.stack import register_project

runner = CliRunner()


def _stack_file(local_stack, tmp_path):
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(local_stack.model_dump()))
    return str(path)


def test_run_status_and_listings(local_stack, project_id, tmp_path):
    register_project(local_stack, project_id, [{"name": "build", "run": "true"}])
    stack_file = _stack_file(local_stack, tmp_path)

    ran = runner.invoke(app, ["run", project_id, "--ref", "main", "--stack-file", stack_file])
    again = runner.invoke(app, ["run", project_id, "--ref", "main", "--stack-file", stack_file])
    job_id = ran.output.split()[1]
    status = runner.invoke(app, ["status", job_id, "--json", "--stack-file", stack_file])
    shown = runner.invoke(app, ["job", "show", job_id, "--json", "--stack-file", stack_file])
    projects = runner.invoke(app, ["project", "list", "--stack-file", stack_file])
    dlq = runner.invoke(app, ["dlq", "list", "--stack-file", stack_file])

    assert ran.exit_code == 0 and job_id.startswith("job_"), ran.output
    # A duplicate names the job it is and that job's status (queued, or running once dispatched),
    # and exits 3: nothing new was started.
    assert again.exit_code == 3 and f"as {job_id} (" in again.output, again.output
    assert status.exit_code == 0 and json.loads(status.output)["trigger"]["type"] == "manual"
    assert shown.exit_code == 0 and json.loads(shown.output)["job_id"] == job_id
    assert projects.exit_code == 0 and project_id in projects.output
    assert dlq.exit_code == 0 and "dead-lettered jobs" in dlq.output
    runner.invoke(app, ["cancel", job_id, "--stack-file", stack_file])


def test_a_refusal_prints_its_code_and_exits_1(local_stack, tmp_path):
    # A job that does not exist is one the caller may not view: FORBIDDEN, never a hint it is missing.
    result = runner.invoke(
        app, ["status", "job_" + "0" * 26, "--stack-file", _stack_file(local_stack, tmp_path)]
    )
    assert result.exit_code == 1
    assert "FORBIDDEN" in result.output


def test_project_grant_and_revoke(local_stack, project_id, tmp_path):
    register_project(local_stack, project_id, [{"name": "build", "run": "true"}])
    stack_file = _stack_file(local_stack, tmp_path)
    bot = "arn:aws:sts::123456789012:assumed-role/ReleaseBot/*"

    granted = runner.invoke(app, ["project", "grant", project_id, bot, "operate", "--stack-file", stack_file])
    listed = runner.invoke(app, ["project", "grants", project_id, "--stack-file", stack_file])
    revoked = runner.invoke(app, ["project", "grant", project_id, bot, "none", "--stack-file", stack_file])
    after = runner.invoke(app, ["project", "grants", project_id, "--stack-file", stack_file])
    bad = runner.invoke(app, ["project", "grant", project_id, bot, "admin", "--stack-file", stack_file])

    assert granted.exit_code == 0 and "operate" in granted.output, granted.output
    # creator + bot + the stack's admin; the table wraps long ARNs, so count rows by the title.
    assert listed.exit_code == 0 and "3 grants" in listed.output and "operate" in listed.output
    assert revoked.exit_code == 0 and "none" in revoked.output
    assert after.exit_code == 0 and "2 grants" in after.output
    assert bad.exit_code == 1 and "VALIDATION_FAILED" in bad.output
