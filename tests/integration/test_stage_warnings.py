"""The `warning` stage status, from the agent to what people read: a stage that exits with one of
its warning_exit_codes, or prints a line marked `::warning::`, ends `warning`; the job goes on and
succeeds; the job record the state machine writes at the end says which stages warned (the
commit status reads it), and the job view, `relevo job view` and `relevo job logs` show it. The
stages are run by relevo_agent's Agent in this process (claim, run, ship, report)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_agent.config import AgentConfig
from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_cli.api import RelevoApi
from relevo_cli.commands.common import console
from relevo_cli.main import app
from relevo_core.notify.transitions import warning_stages
from tests.helpers.agents import handle_received
from tests.helpers.stack import job_record, receive_stage, register_project, wait_for_execution

runner = CliRunner()
STAGES = [
    # A linter's "found something, not fatal" exit code.
    {"name": "lint", "run": 'echo "3 style issues"; exit 3', "warning_exit_codes": [3]},
    # Exits 0 but marks a line as a warning (GitHub Actions' spelling).
    {
        "name": "build",
        "run": 'echo compiling; echo "::warning file=App.swift,line=12::deprecated API"; echo done',
    },
    {"name": "deploy", "run": "echo deployed"},
]


def _agent(tmp_path: Path, stack) -> Agent:
    config = AgentConfig(
        agent_id="mac-warn",
        region="eu-west",
        capacity=1,
        workspace_root=tmp_path / "ws",
        journal=tmp_path / "journal.sqlite3",
        max_clock_skew_sec=0.5,
    )
    return Agent(config, stack.table_name, stack.work_queues["eu-west"], api_url=stack.api_url)


@pytest.mark.timeout(180)
def test_a_stage_with_warnings_ends_warning_and_the_job_goes_on_to_succeed(
    local_stack, project_id, tmp_path, monkeypatch
):
    monkeypatch.setattr(console, "width", 250)
    register_project(local_stack, project_id, STAGES, queue_timeout_sec=120)
    api = RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    agent = _agent(tmp_path, local_stack)
    for _ in STAGES:
        task, receipt = receive_stage(local_stack, job_id, timeout=60)
        handle_received(
            agent,
            Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
        )
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

    job = api.get_job(job_id)
    assert job["status"] == "succeeded"
    assert [(s["name"], s["status"], s["exit_code"]) for s in job["stages"]] == [
        ("lint", "warning", 3),
        ("build", "warning", 0),
        ("deploy", "succeeded", 0),
    ]
    assert job["warning_stages"] == ["lint", "build"]
    assert job["stages"][0]["warning"] == "exit 3 (one of its warning_exit_codes)"
    assert job["stages"][1]["warning"] == "1 line marked ::warning::, first: deprecated API"
    assert job["last_successful_stage"] == "deploy"
    # What the state machine wrote at the end, which the commit status reads
    assert warning_stages(job_record(local_stack, job_id)["stage_outcomes"]) == ("lint", "build")

    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(local_stack.model_dump()))
    shown = runner.invoke(app, ["job", "view", job_id, "--stack-file", str(stack_file)])
    logs = runner.invoke(app, ["job", "logs", job_id, "--stack-file", str(stack_file)])
    assert shown.exit_code == 0 and "succeeded with warnings in lint, build" in shown.output, shown.output
    assert "lint warning: exit 3 (one of its warning_exit_codes)" in shown.output
    assert logs.exit_code == 0, logs.output
    # (each end line says how long its stage ran: ` after 1s`, left out here)
    said = re.sub(r" after (?:\d+h \d+m|\d+m \d+s|\d+s)", "", logs.stdout)
    assert "── lint succeeded with warnings on mac-warn: exit 3 (one of its warning_exit_codes) ──" in said, (
        logs.stdout
    )
    assert (
        "── build succeeded with warnings on mac-warn: 1 line marked ::warning::, first: deprecated API ──"
        in said
    )
    assert "build#1 | ::warning file=App.swift,line=12::deprecated API" in said
    assert "── deploy succeeded on mac-warn ──" in said
