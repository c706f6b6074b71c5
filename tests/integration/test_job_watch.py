"""`relevo job watch JOB` (as `gh run watch`): a line for the job and each stage as they move, and
the job's outcome as the exit status."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from relevo_cli.api import RelevoApi
from relevo_cli.commands.common import console
from relevo_cli.main import app
from tests.helpers.stack import receive_stage, register_project, wait_until
from tests.helpers.state_machine import agent_runs

runner = CliRunner()


def test_watch_follows_the_stages_and_exits_with_the_jobs_outcome(
    local_stack, project_id, tmp_path: Path, monkeypatch
):
    monkeypatch.setattr(console, "width", 250)
    register_project(
        local_stack, project_id, [{"name": "build", "run": "make"}, {"name": "sign", "run": "make sign"}]
    )
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(local_stack.model_dump()))
    api = RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    for succeed in (True, False):
        task, _ = receive_stage(local_stack, job_id)
        agent_runs(local_stack, task, succeed=succeed, agent_id="mac-watch")
    wait_until(lambda: api.get_job(job_id)["status"] == "failed", 30, "the job to fail")

    watched = runner.invoke(app, ["job", "watch", job_id, "--stack-file", str(stack_file)])

    assert watched.exit_code == 1, watched.output
    assert watched.output.splitlines() == [
        f"job {job_id} failed",
        "  build succeeded on mac-watch (attempt 1)",
        "  sign failed on mac-watch (attempt 1)",
    ], watched.output
