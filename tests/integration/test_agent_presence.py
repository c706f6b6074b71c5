"""Agent presence on the embedded stack: which agents of a region are online with free slots,
the queue reason of a dispatched stage nobody claimed, the agent's presence writer and its
hand-back of a retry to another online agent, free or busy."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path

from typer.testing import CliRunner

from relevo_agent.config import AgentConfig
from relevo_agent.messages import Message
from relevo_agent.placement import Placement
from relevo_agent.presence import Presence
from relevo_agent.stop import AgentStop
from relevo_cli.api import RelevoApi
from relevo_cli.main import app
from relevo_core.aws import client
from relevo_core.jobs.view import agent_queue_reason
from relevo_core.models.status import QueueReason
from relevo_core.store import agents
from relevo_core.store.agents import ONLINE_MULTIPLE, AgentPresence
from tests.helpers.stack import wait_until
from tests.helpers.state_machine import start_job

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _region() -> str:
    return "r-" + secrets.token_hex(4)  # presence only: no work queue needed, nobody else writes here


def _presence(
    region: str,
    agent_id: str,
    capacity: int = 1,
    running: int = 0,
    seen: datetime = NOW,
    interval: float = 30,
) -> AgentPresence:
    return AgentPresence(
        agent_id=agent_id,
        region=region,
        capacity=capacity,
        running=running,
        version="0.1.0",
        last_seen=seen,
        interval_sec=interval,
    )


def test_online_agents_of_a_region_with_their_free_capacity(local_stack):
    region, elsewhere = _region(), _region()
    limit = ONLINE_MULTIPLE * 30
    agents.put_presence(
        local_stack.table_name,
        _presence(region, "mac-a", capacity=2, running=1, seen=NOW - timedelta(seconds=10)),
    )
    agents.put_presence(
        local_stack.table_name, _presence(region, "mac-b", running=1, seen=NOW - timedelta(seconds=limit))
    )
    agents.put_presence(
        local_stack.table_name, _presence(region, "mac-stale", seen=NOW - timedelta(seconds=limit + 1))
    )
    agents.put_presence(local_stack.table_name, _presence(elsewhere, "mac-other"))

    online = agents.online_agents(local_stack.table_name, region, NOW)

    assert [(a.agent_id, a.capacity, a.running, a.free) for a in online] == [
        ("mac-a", 2, 1, 1),
        ("mac-b", 1, 1, 0),
    ]
    assert {a.agent_id for a in agents.agents_in_region(local_stack.table_name, region)} == {
        "mac-a",
        "mac-b",
        "mac-stale",
    }
    # The record carries a TTL so a retired agent's record goes away by itself.
    item = client("dynamodb").get_item(
        TableName=local_stack.table_name, Key={"pk": {"S": f"AGENTS#{region}"}, "sk": {"S": "AGENT#mac-a"}}
    )["Item"]
    assert int(item["ttl"]["N"]) == int((NOW - timedelta(seconds=10)).timestamp()) + agents.PRESENCE_TTL_SEC


def test_a_clean_stop_takes_an_agent_offline_at_once(local_stack):
    region = _region()
    agents.put_presence(local_stack.table_name, _presence(region, "mac-a"))

    agents.mark_offline(local_stack.table_name, region, "mac-a", NOW + timedelta(seconds=1))
    agents.mark_offline(local_stack.table_name, region, "mac-never-seen", NOW)  # harmless

    [record] = agents.agents_in_region(local_stack.table_name, region)
    assert (record.agent_id, record.online, record.running) == ("mac-a", False, 0)
    assert agents.online_agents(local_stack.table_name, region, NOW + timedelta(seconds=2)) == []


def test_queue_reason_tells_busy_agents_from_none_online(local_stack):
    region = _region()

    def reason():
        return agent_queue_reason(agents.agents_in_region(local_stack.table_name, region), NOW)

    assert reason() is QueueReason.AGENT_OFFLINE  # nobody ever seen
    agents.put_presence(local_stack.table_name, _presence(region, "mac-gone", seen=NOW - timedelta(hours=1)))
    assert reason() is QueueReason.AGENT_OFFLINE  # only a stale record
    agents.put_presence(local_stack.table_name, _presence(region, "mac-a", capacity=2, running=2))
    agents.put_presence(local_stack.table_name, _presence(region, "mac-b", capacity=1, running=1))
    assert reason() is QueueReason.AGENT_BUSY
    agents.put_presence(local_stack.table_name, _presence(region, "mac-b", capacity=1, running=0))
    assert reason() is None  # a free agent will claim it
    agents.mark_offline(local_stack.table_name, region, "mac-b", NOW)
    assert reason() is QueueReason.AGENT_BUSY


def test_the_job_view_and_relevo_status_say_why_a_dispatched_stage_waits(
    local_stack, project_id, tmp_path: Path
):
    # us-east: no test agent writes presence there in real time, so nobody is online at first.
    job_id = start_job(
        local_stack, project_id, stages=[{"name": "build", "run": "true"}], region_affinity="us-east"
    )
    api = RelevoApi.for_stack(local_stack)
    job = wait_until(
        lambda: (j := api.get_job(job_id))["stages"][0]["status"] == "dispatched" and j, timeout=20
    )
    assert (job["status"], job["queue_reason"]) == ("running", "agent_offline")

    now = datetime.now(UTC)
    agents.put_presence(
        local_stack.table_name, _presence("us-east", f"busy-{project_id}", running=1, seen=now)
    )
    try:
        assert api.get_job(job_id)["queue_reason"] == "agent_busy"
        stack_file = tmp_path / "stack.json"
        stack_file.write_text(json.dumps(local_stack.model_dump()))
        shown = CliRunner().invoke(
            app, ["status", job_id, "--stack-file", str(stack_file)], terminal_width=200
        )
        # Read as words: rich lays the table out at its own width (80 columns here, not the
        # runner's), and may wrap the heading's reason onto a second line.
        assert (
            shown.exit_code == 0
            and "waiting (agent_busy): every agent of region affinity us-east has all its slots in use"
            in shown.output
        ), shown.output
        agents.put_presence(
            local_stack.table_name, _presence("us-east", f"busy-{project_id}", running=0, seen=now)
        )
        assert api.get_job(job_id)["queue_reason"] is None  # a free agent is about to claim it
    finally:
        agents.mark_offline(local_stack.table_name, "us-east", f"busy-{project_id}", now)
        api.cancel_job(job_id)
    # An ended job has no queue reason, whatever the stage record still says.
    assert (
        wait_until(lambda: (j := api.get_job(job_id))["status"] == "canceled" and j, 20)["queue_reason"]
        is None
    )


def _receiver(queue_url: str):
    """receive(wait) -> the next message of the queue with its attributes, or None."""

    def receive(wait: int = 0):
        messages = (
            client("sqs")
            .receive_message(
                QueueUrl=queue_url,
                WaitTimeSeconds=wait,
                MessageSystemAttributeNames=["SentTimestamp", "ApproximateReceiveCount"],
            )
            .get("Messages", [])
        )
        return Message(queue_url, messages[0]) if messages else None

    return receive


def _record(table: str, region: str) -> AgentPresence | None:
    """The region's one agent record, as written (None before the first write)."""
    found = agents.agents_in_region(table, region)
    return found[0] if found else None


def _config(region: str, agent_id: str, tmp_path: Path, **extra) -> AgentConfig:
    return AgentConfig(
        agent_id=agent_id,
        region=region,
        capacity=2,
        workspace_root=tmp_path,
        journal=tmp_path / "j.sqlite3",
        **extra,
    )


def test_the_presence_writer_keeps_the_record_fresh_counts_running_stages_and_goes_offline(
    local_stack, tmp_path: Path
):
    region = _region()
    presence = Presence(
        _config(region, "mac-w", tmp_path, presence_interval_sec=0.2), local_stack.table_name, AgentStop()
    )

    def record():
        return _record(local_stack.table_name, region)

    presence.start()
    try:
        first = wait_until(record, 10)
        assert (first.agent_id, first.capacity, first.running, first.online, first.interval_sec) == (
            "mac-w",
            2,
            0,
            True,
            0.2,
        )
        assert first.version == metadata.version("relevo-agent")
        # Written again every interval: last_seen moves on.
        wait_until(lambda: record().last_seen > first.last_seen, 10)
        with presence.occupied():
            assert wait_until(lambda: (r := record()).running == 1 and r, 10).free == 1
        wait_until(lambda: record().running == 0, 10)
    finally:
        presence.stop()
    assert record().online is False
    assert agents.online_agents(local_stack.table_name, region, datetime.now(UTC)) == []


def test_an_agent_hands_back_a_retry_it_should_avoid_while_another_is_free(local_stack, tmp_path: Path):
    region = _region()
    sqs = client("sqs")
    queue_url = sqs.create_queue(QueueName=f"handback-{secrets.token_hex(4)}")["QueueUrl"]
    stopping = AgentStop()
    stopping.gracefully()  # skip the slot's pause after a hand-back: this test polls the queue itself
    placement = Placement(
        _config(region, "mac-a", tmp_path, handoff_delay_sec=1), local_stack.table_name, stopping
    )
    sqs.send_message(QueueUrl=queue_url, MessageBody="{}")
    receive = _receiver(queue_url)

    message = receive()
    # Nobody else online: mac-a falls back to running its own retry.
    assert placement.leave_to_another(["mac-a"], 30, message) is False
    # Not named by the retry: nothing to decide.
    assert placement.leave_to_another(["mac-x"], 30, message) is False

    now = datetime.now(UTC)
    agents.put_presence(local_stack.table_name, _presence(region, "mac-b", capacity=1, running=0, seen=now))
    assert placement.leave_to_another(["mac-a"], 30, message) is True
    # Handed back: invisible for handoff_delay_sec, then another agent's poll receives it.
    assert receive() is None
    again = wait_until(lambda: receive(wait=1), timeout=10)
    assert again.message_id == message.message_id and again.receive_count == 2

    # The wait is bounded by half the job's queue timeout: sent at least handoff_delay_sec (1 s)
    # ago, a stage with a 2 s queue timeout is taken here rather than handed back again.
    assert placement.leave_to_another(["mac-a"], 2, again) is False
    assert placement.leave_to_another(["mac-a"], 30, again) is True
    third = wait_until(lambda: receive(wait=1), timeout=10)
    # Received HANDOFF_MAX_RECEIVES (3) times: taken here, before the queue's redrive DLQ.
    assert third.receive_count == 3
    assert placement.leave_to_another(["mac-a"], 30, third) is False
    sqs.delete_queue(QueueUrl=queue_url)


def test_an_agent_hands_back_a_retry_it_should_avoid_while_another_is_online_but_busy(
    local_stack, tmp_path: Path
):
    region = _region()
    sqs = client("sqs")
    queue_url = sqs.create_queue(QueueName=f"handback-busy-{secrets.token_hex(4)}")["QueueUrl"]
    stopping = AgentStop()
    placement = Placement(
        _config(region, "mac-a", tmp_path, handoff_delay_sec=1), local_stack.table_name, stopping
    )
    sqs.send_message(QueueUrl=queue_url, MessageBody="{}")
    receive = _receiver(queue_url)

    now = datetime.now(UTC)
    agents.put_presence(local_stack.table_name, _presence(region, "mac-b", capacity=1, running=1, seen=now))
    message = receive()
    # mac-b is online at capacity: mac-a still leaves the retry to it. With a 12 s queue timeout
    # the wait is bounded by 6 s, split in two hops (two receives left): invisible for about 3 s.
    assert placement.leave_to_another(["mac-a"], 12, message) is True
    assert receive() is None
    again = wait_until(lambda: receive(wait=1), timeout=10)
    assert again.message_id == message.message_id and again.receive_count == 2

    # mac-b stops cleanly: nobody else is online, mac-a runs its own retry at once.
    agents.mark_offline(local_stack.table_name, region, "mac-b", datetime.now(UTC))
    assert placement.leave_to_another(["mac-a"], 12, again) is False
    # So it does when mac-b's presence goes stale (more than 3 intervals old), busy or not.
    stale = datetime.now(UTC) - timedelta(seconds=ONLINE_MULTIPLE * 30 + 1)
    agents.put_presence(local_stack.table_name, _presence(region, "mac-b", capacity=1, running=1, seen=stale))
    assert placement.leave_to_another(["mac-a"], 12, again) is False
    sqs.delete_queue(QueueUrl=queue_url)


def test_a_stage_passed_on_to_an_agent_meeting_its_requires_keeps_this_slot_off_the_queue_till_visible(
    local_stack, tmp_path: Path
):
    """An agent that passes a stage on for its `requires` holds the slot off the queue while the
    message is invisible and a second more, as a stage left to the previous stage's Mac does: its
    next receive would otherwise be the first to see the message again (the emulator's long poll
    looks once a second, and the agent that hid it polls in step with it), and the agent meeting
    the requires lost the message to it until the queue timeout (make demo, kill scenario then release)."""
    from relevo_core.models.capabilities import Capabilities

    region = _region()
    sqs = client("sqs")
    queue_url = sqs.create_queue(QueueName=f"pass-on-{secrets.token_hex(4)}")["QueueUrl"]
    waits: list[float | None] = []
    stopping = AgentStop()
    stopping.wait = lambda timeout=None: waits.append(timeout) or False  # type: ignore[method-assign]  # spy
    placement = Placement(
        _config(region, "mac-sign", tmp_path, handoff_delay_sec=1, requirement_recheck_sec=2),
        local_stack.table_name,
        stopping,
    )
    placement.capabilities = Capabilities(os="darwin", arch="arm64", labels={"bay": "sign"})
    sqs.send_message(QueueUrl=queue_url, MessageBody="{}")
    receive = _receiver(queue_url)

    # Nobody meets the requires: put back for a later look, and this agent polls on.
    assert placement.leave_to_matching({"bay": "build"}, receive(), "job/build attempt 1") is True
    assert waits == []
    builder = _presence(region, "mac-build", seen=datetime.now(UTC)).model_copy(
        update={"capabilities": Capabilities(os="darwin", arch="arm64", labels={"bay": "build"})}
    )
    agents.put_presence(local_stack.table_name, builder)
    message = wait_until(lambda: receive(wait=1), timeout=10)
    assert placement.leave_to_matching({"bay": "build"}, message, "job/build attempt 1") is True
    assert waits == [2]  # handoff_delay_sec, then a second more
    sqs.delete_queue(QueueUrl=queue_url)


def test_a_slot_freed_is_written_at_once_a_slot_taken_after_the_settle(
    local_stack, tmp_path: Path, monkeypatch
):
    """A stage taken is written COUNT_SETTLE_SEC later (not beside its claim); a slot freed at
    once: the job's next stage may be left to this agent because it is free (leave_to_previous
    reads the record), and with the settle on both the next stage saw it busy and ran elsewhere."""
    from relevo_agent import presence as presence_module

    monkeypatch.setattr(presence_module, "COUNT_SETTLE_SEC", 3.0)
    region = _region()
    presence = Presence(
        _config(region, "mac-f", tmp_path, presence_interval_sec=60), local_stack.table_name, AgentStop()
    )

    def record():
        return _record(local_stack.table_name, region)

    presence.start()
    try:
        wait_until(record, 10)
        with presence.occupied():
            wait_until(lambda: record().running == 1, 10)
        freed_at = datetime.now(UTC)
        wait_until(lambda: record().running == 0, 2)  # well inside the 3 s settle
        assert (datetime.now(UTC) - freed_at).total_seconds() < 2
    finally:
        presence.stop()
