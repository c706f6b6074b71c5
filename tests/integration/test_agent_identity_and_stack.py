"""Issue 14, points 7 and 8, with the real agent code in this process: one relevo-agent per
agent_id (a second live one refuses to start, naming the other), and an agent whose stack went
away exits non-zero with one line (launchd restarts it), and doctor says what changed. Each test
gives its agents a work queue of their own, so nothing of the suite's other jobs reaches them."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_agent.cli import app
from relevo_agent.config import AgentConfig
from relevo_agent.service import EXIT_AGENT_ID_IN_USE, EXIT_STACK_GONE, INSTANCE_KEY, Agent
from relevo_core.aws import client
from relevo_core.store import agents
from tests.helpers.stack import wait_until


@pytest.fixture()
def queue_url() -> Iterator[str]:
    url = client("sqs").create_queue(QueueName=f"agent-test-{secrets.token_hex(4)}")["QueueUrl"]
    yield url
    try:
        client("sqs").delete_queue(QueueUrl=url)
    except Exception:
        pass


def _agent(tmp_path: Path, table: str, queue_url: str, agent_id: str, name: str, **settings) -> Agent:
    config = AgentConfig(
        agent_id=agent_id,
        region="eu-west",
        capacity=1,
        workspace_root=tmp_path / f"{name}-ws",
        journal=tmp_path / f"{name}.sqlite3",
        poll_wait_sec=1,
        presence_interval_sec=1,
        **settings,
    )
    return Agent(config, table, queue_url)


def _instance(stack, agent_id: str) -> str | None:
    """The instance the agent_id's presence record names."""
    return next(
        (
            a.instance_id
            for a in agents.agents_in_region(stack.table_name, "eu-west")
            if a.agent_id == agent_id
        ),
        None,
    )


def _run(agent: Agent) -> tuple[threading.Thread, dict[str, int]]:
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.setdefault("status", agent.run()), daemon=True)
    thread.start()
    return thread, result


def _stop(agent: Agent, thread: threading.Thread) -> None:
    agent.signals = 2
    thread.join(30)


def test_a_second_agent_with_a_live_agent_id_refuses_to_start_and_names_the_other(
    local_stack, tmp_path, queue_url, caplog
):
    agent_id = "mac-clone-" + secrets.token_hex(3)
    first = _agent(tmp_path, local_stack.table_name, queue_url, agent_id, "first")
    running, _ = _run(first)
    try:
        wait_until(
            lambda: _instance(local_stack, agent_id) == first.presence.instance_id,
            10,
            "the first agent's presence",
        )
        caplog.set_level(logging.ERROR, logger="relevo_agent")
        # A cloned Mac image: the same agent_id, a journal of its own.
        second = _agent(tmp_path, local_stack.table_name, queue_url, agent_id, "second")
        assert second.run() == EXIT_AGENT_ID_IN_USE
        line = next(r.getMessage() for r in caplog.records if "in use" in r.getMessage())
        assert first.presence.host in line and first.presence.instance_id in line
        assert first.presence.started_at.isoformat(timespec="seconds") in line
        assert _instance(local_stack, agent_id) == first.presence.instance_id  # the second wrote nothing
        assert running.is_alive() and first.stop.fatal is None
    finally:
        _stop(first, running)


def test_an_agent_restarted_on_its_own_journal_takes_its_agent_id_back_at_once(
    local_stack, tmp_path, queue_url
):
    # A relevo-agent SIGKILLed (or crashed) and restarted by launchd at once: its record still
    # looks online, but it names the instance this Mac's journal last ran as.
    agent_id = "mac-killed-" + secrets.token_hex(3)
    killed = _agent(tmp_path, local_stack.table_name, queue_url, agent_id, "mac")
    killed.presence.take(predecessor=killed.journal.recall(INSTANCE_KEY))
    killed.journal.remember(INSTANCE_KEY, killed.presence.instance_id)
    killed.journal.close()
    # A clone (a journal of its own) is refused while the record is fresh...
    clone = _agent(tmp_path, local_stack.table_name, queue_url, agent_id, "clone")
    with pytest.raises(agents.AgentIdInUse):
        clone.presence.take(predecessor=clone.journal.recall(INSTANCE_KEY))

    # ...the restart, on the journal the killed one ran with, is not
    restarted = _agent(tmp_path, local_stack.table_name, queue_url, agent_id, "mac")  # the same journal
    running, result = _run(restarted)
    try:
        wait_until(
            lambda: _instance(local_stack, agent_id) == restarted.presence.instance_id,
            10,
            "the restarted agent's presence",
        )
        assert running.is_alive() and "status" not in result
    finally:
        _stop(restarted, running)


def test_an_agent_id_whose_holder_went_silent_can_be_taken(local_stack, tmp_path, queue_url):
    agent_id = "mac-restart-" + secrets.token_hex(3)
    silent = _agent(tmp_path, local_stack.table_name, queue_url, agent_id, "silent")
    # Its last write was more than 3 presence intervals ago: dead, frozen or cut off.
    stale = silent.presence._record().model_copy(
        update={"last_seen": datetime.now(UTC) - timedelta(seconds=10)}
    )
    client("dynamodb").put_item(
        TableName=local_stack.table_name, Item=agents.to_attributes(agents._item(stale))
    )

    successor = _agent(tmp_path, local_stack.table_name, queue_url, agent_id, "successor")
    successor.presence.take()

    assert _instance(local_stack, agent_id) == successor.presence.instance_id
    with pytest.raises(agents.AgentIdInUse):  # the silent one, back, cannot overwrite it
        silent.presence.write()


def test_an_agent_whose_agent_id_was_taken_over_exits(local_stack, tmp_path, queue_url):
    agent_id = "mac-taken-" + secrets.token_hex(3)
    old = _agent(tmp_path, local_stack.table_name, queue_url, agent_id, "old")
    running, result = _run(old)
    try:
        wait_until(
            lambda: _instance(local_stack, agent_id) == old.presence.instance_id,
            10,
            "the agent's own presence",
        )
        other = old.presence._record().model_copy(
            update={"instance_id": "another-process", "host": "mac-mini-7"}
        )
        client("dynamodb").put_item(
            TableName=local_stack.table_name, Item=agents.to_attributes(agents._item(other))
        )
        running.join(15)
        assert result.get("status") == EXIT_STACK_GONE  # it learns at its next presence write
        assert "on host mac-mini-7" in (old.stop.fatal or "") and "that process is this agent now" in (
            old.stop.fatal or ""
        )
    finally:
        _stop(old, running)


def test_an_agent_whose_stack_is_gone_exits_with_one_line(local_stack, tmp_path, caplog):
    queue = client("sqs").create_queue(QueueName=f"agent-test-{secrets.token_hex(4)}")["QueueUrl"]
    client("sqs").delete_queue(QueueUrl=queue)
    agent = _agent(tmp_path, "relevo-table-that-was", queue, "mac-" + secrets.token_hex(3), "gone")
    caplog.set_level(logging.ERROR, logger="relevo_agent")
    running, result = _run(agent)
    running.join(30)
    assert not running.is_alive(), "the agent kept looping on a stack that is gone"
    assert result["status"] == EXIT_STACK_GONE
    [line] = [r.getMessage() for r in caplog.records if "the stack is gone" in r.getMessage()]
    assert "relevo-table-that-was does not exist (ResourceNotFoundException)" in line


def test_an_agent_exits_when_its_stack_file_names_another_stack(local_stack, tmp_path, queue_url):
    stack_file = tmp_path / "stack.json"
    stack = local_stack.model_copy(update={"work_queues": {"eu-west": queue_url}})
    stack_file.write_text(stack.model_dump_json())
    agent = _agent(
        tmp_path,
        local_stack.table_name,
        queue_url,
        "mac-" + secrets.token_hex(3),
        "moved",
        stack_file=stack_file,
    )
    # The agent notes the file at its first look (once started): rewritten before that, the new
    # file is what it notes, and a loaded host may take longer than any fixed wait to get there.
    looked = threading.Event()
    look = agent._stack_file_changed

    def noted(seen):
        look(seen)
        looked.set()

    agent._stack_file_changed = noted  # type: ignore[method-assign]  # observed
    running, result = _run(agent)
    try:
        assert looked.wait(30), "the agent never looked at its stack file"
        # `relevo local up` again: a new table (and ports) in the same stack file.
        resources = {**stack.resources, "Table": "relevo-Table-NEW"}
        stack_file.write_text(stack.model_copy(update={"resources": resources}).model_dump_json())
        running.join(20)
        assert result.get("status") == EXIT_STACK_GONE
        assert f"table {local_stack.table_name} -> relevo-Table-NEW" in (agent.stop.fatal or "")
    finally:
        _stop(agent, running)


def test_doctor_says_what_changed_since_the_agents_last_run(local_stack, tmp_path, queue_url):
    agent = _agent(tmp_path, local_stack.table_name, queue_url, "mac-" + secrets.token_hex(3), "doc")
    agent.journal.remember(
        "stack",
        '{"endpoint": "http://127.0.0.1:1", "table": "relevo-Table-OLD", "queue": "q-old", "at": '
        '"2026-12-01T08:00:00+00:00"}',
    )
    agent.journal.close()
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(local_stack.model_dump_json())
    config = tmp_path / "agent.toml"
    config.write_text(
        f'region = "eu-west"\nstack_file = "{stack_file}"\njournal = "{tmp_path / "doc.sqlite3"}"\n'
        f'workspace_root = "{tmp_path / "ws"}"\nmin_free_disk_gb = 0\n'
    )
    result = CliRunner().invoke(app, ["doctor", "--config", str(config)])
    line = next(line for line in result.output.splitlines() if "stack:" in line)
    assert line.startswith("ok    stack: changed since the agent's last run (2026-12-01T08:00:00+00:00)")
    assert f"table relevo-Table-OLD -> {local_stack.table_name}" in line
