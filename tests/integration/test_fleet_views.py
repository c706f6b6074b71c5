"""The fleet and what waits for it: `relevo queue` lists a running job whose stage is on its region's
queue with nobody to claim it (agent_offline / agent_busy), and `relevo agents` lists every agent
per region affinity: online or not, last seen, used / capacity, the stages it runs, its version."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_cli.api import RelevoApi
from relevo_cli.commands.common import console
from relevo_cli.main import app
from relevo_core.models.status import queue_reason_words
from relevo_core.store import agents
from tests.helpers.stack import job_items, receive_stage, register_project, wait_until
from tests.helpers.state_machine import claim_and_accept, wait_for_run_token

runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "width", 250)  # the console took its width when it was created


def _stack_file(local_stack, tmp_path: Path) -> str:
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(local_stack.model_dump()))
    return str(path)


def _cli(stack_file: str, *args: str) -> str:
    result = runner.invoke(app, [*args, "--stack-file", stack_file])
    assert result.exit_code == 0, result.output
    return result.output


def _dispatched(local_stack, job_id: str) -> None:
    wait_until(
        lambda: any(
            i["sk"]["S"] == "STAGE#00" and i["status"]["S"] == "dispatched"
            for i in job_items(local_stack, job_id)
        ),
        30,
        "stage dispatched",
    )


def test_the_queue_lists_a_running_job_whose_stage_waits_for_an_agent(
    local_stack, project_id, tmp_path: Path
):
    # A queue timeout long enough that the unclaimed stage is still waiting however slow the machine.
    register_project(local_stack, project_id, [{"name": "build", "run": "make"}], queue_timeout_sec=600)
    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    _dispatched(local_stack, job_id)
    try:
        view = json.loads(_cli(stack_file, "queue", "--json"))
        shown = _cli(stack_file, "queue")

        [waiting] = [job for job in view["waiting_for_agent"] if job["job_id"] == job_id]
        # The same reason the job's own view gives, from the region's agent presence.
        assert (waiting["status"], waiting["stage"], waiting["queue_reason"]) == (
            "running",
            "build",
            api.get_job(job_id)["queue_reason"],
        )
        # In words, with the reason's code beside them.
        reason = (
            f"{queue_reason_words(waiting['queue_reason'], 'eu-west')} ({waiting['queue_reason']})"
            if waiting["queue_reason"]
            else "about to be claimed (free agent)"
        )
        assert job_id in shown and f"stage build: {reason}" in shown, shown
    finally:
        api.cancel_job(job_id)


def test_agents_lists_the_fleet_per_region_with_the_stages_each_runs(local_stack, project_id, tmp_path: Path):
    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    suffix, now = secrets.token_hex(3), datetime.now(UTC)
    busy, gone = f"mac-busy-{suffix}", f"mac-gone-{suffix}"
    agents.put_presence(
        local_stack.table_name,
        agents.AgentPresence(
            agent_id=busy,
            region="eu-west",
            capacity=2,
            running=1,
            version="9.9.9",
            last_seen=now,
            interval_sec=30,
        ),
    )
    agents.put_presence(
        local_stack.table_name,
        agents.AgentPresence(
            agent_id=gone,
            region="us-east",
            capacity=1,
            running=0,
            version="9.9.8",
            last_seen=now - timedelta(hours=1),
            interval_sec=30,
        ),
    )
    # A lease long enough that the claimed stage stays running (nobody heartbeats it here) while
    # the CLI is asked twice, however slow the machine.
    register_project(local_stack, project_id, [{"name": "build", "run": "make"}], lease_ttl_sec=600)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(local_stack, job_id)
    wait_for_run_token(claim_and_accept(local_stack, task, busy, lease_ttl_sec=600))
    try:
        fleet = json.loads(_cli(stack_file, "agents", "--json"))
        shown = _cli(stack_file, "agents")

        assert set(fleet) >= {"eu-west", "us-east"}
        [row] = [a for a in fleet["eu-west"] if a["agent_id"] == busy]
        assert (row["online"], row["used"], row["capacity"], row["version"]) == (True, 1, 2, "9.9.9")
        assert row["running_stages"] == [
            {"job_id": job_id, "project": project_id, "stage": "build", "attempt": 1}
        ]
        [offline] = [a for a in fleet["us-east"] if a["agent_id"] == gone]
        assert offline["online"] is False
        busy_line = next(line for line in shown.splitlines() if busy in line)
        assert (
            "online" in busy_line
            and "1 / 2" in busy_line
            and f"{job_id} build#1" in busy_line
            and "9.9.9" in busy_line
        )
        gone_line = next(line for line in shown.splitlines() if gone in line)
        assert "offline" in gone_line and "(60m ago)" in gone_line
        assert "eu-west:" in shown and "us-east:" in shown
    finally:
        api.cancel_job(job_id)


def test_piped_listings_keep_every_id_whole(local_stack, project_id, tmp_path: Path):
    """`relevo agents | cat` once showed `local-eu…` for two different agents: piped (no terminal,
    no COLUMNS), a listing is as wide as its cells and no id is cut."""
    import os
    import subprocess
    import sys

    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    now, suffix = datetime.now(UTC), secrets.token_hex(3)
    twins = [f"local-eu-west-mac-mini-in-the-second-rack-{suffix}-{n}" for n in (1, 2)]
    for agent_id in twins:
        agents.put_presence(
            local_stack.table_name,
            agents.AgentPresence(
                agent_id=agent_id,
                region="eu-west",
                capacity=1,
                running=0,
                version="9.9.9",
                last_seen=now,
                interval_sec=30,
            ),
        )
    register_project(local_stack, project_id, [{"name": "build", "run": "make"}], queue_timeout_sec=600)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    env = {name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES")}

    def piped(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "relevo_cli.main", *args, "--stack-file", stack_file],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    try:
        fleet, queue, listed = piped("agents"), piped("queue"), piped("jobs", "--project", project_id)
        assert all(agent_id in fleet for agent_id in twins), fleet
        assert all(agent_id in queue for agent_id in twins) and job_id in queue, queue
        assert job_id in listed, listed
        assert "…" not in fleet + queue + listed
    finally:
        api.cancel_job(job_id)
