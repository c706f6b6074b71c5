"""The agent's pause gate (relevo_agent.pause): a pause ends at its stored `until` or `timeout_sec`
after the agent first saw it on its monotonic clock, whichever is first; a drain exits only an
instance that was running when it appeared. The injected monotonic clock stands in for time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from relevo_agent.pause import PauseGate
from relevo_cli.cli_errors import UserMistake
from relevo_cli.commands.agents import parse_duration
from relevo_core.jobs.view import agent_queue_reason
from relevo_core.models.status import QueueReason
from relevo_core.store.agent_pauses import AgentPause
from relevo_core.store.agents import AgentPresence

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pause(
    timeout_sec: int = 300, drain: bool = False, set_at: datetime = T0, agent_id: str | None = "mac-1"
) -> AgentPause:
    return AgentPause(
        region="eu",
        agent_id=agent_id,
        drain=drain,
        set_at=set_at,
        until=set_at + timedelta(seconds=timeout_sec),
        timeout_sec=timeout_sec,
    )


def test_a_pause_ends_on_the_monotonic_clock_even_when_the_wall_clock_is_behind():
    clock = Clock()
    gate = PauseGate(monotonic=clock)
    pause = _pause(timeout_sec=300)
    # This Mac's wall clock is an hour behind: by it, the pause would last 65 minutes.
    gate.observe(pause, None, T0 - timedelta(hours=1))
    assert gate.blocking() == pause and gate.reason() == "agent_paused"
    clock.now += 299
    gate.observe(pause, None, T0 - timedelta(hours=1) + timedelta(seconds=299))
    assert gate.blocking() == pause
    clock.now += 2
    gate.observe(pause, None, T0 - timedelta(hours=1) + timedelta(seconds=301))
    assert gate.blocking() is None and gate.reason() is None


def test_a_pause_seen_late_ends_at_its_until_and_an_unreadable_table_keeps_the_last_read():
    clock = Clock()
    gate = PauseGate(monotonic=clock)
    # First read 200 s into a 300 s pause: 100 s are left, not 300.
    gate.observe(_pause(300), None, T0 + timedelta(seconds=200))
    clock.now += 99
    assert gate.blocking() is not None  # no new read (the table unreachable): still paused
    clock.now += 2
    assert gate.blocking() is None


def test_resume_and_a_new_pause():
    clock = Clock()
    gate = PauseGate(monotonic=clock)
    gate.observe(_pause(60), None, T0)
    gate.observe(None, None, T0 + timedelta(seconds=1))  # resumed: the item is gone
    assert gate.blocking() is None
    clock.now += 50
    later = _pause(60, set_at=T0 + timedelta(seconds=50))
    gate.observe(later, None, T0 + timedelta(seconds=50))
    clock.now += 59
    assert gate.blocking() == later  # a new pause has a clock of its own


def test_the_regions_dispatch_pause_blocks_too():
    gate = PauseGate(monotonic=Clock())
    dispatch = _pause(60, agent_id=None)
    gate.observe(None, dispatch, T0)
    assert gate.blocking() == dispatch and not gate.drain_requested()


def test_a_drain_exits_only_the_instance_that_was_running_when_it_appeared():
    found_at_start = PauseGate(monotonic=Clock())
    found_at_start.observe(_pause(600, drain=True), None, T0)
    assert found_at_start.blocking() is not None and not found_at_start.drain_requested()

    running = PauseGate(monotonic=Clock())
    running.observe(None, None, T0)
    running.observe(_pause(600, drain=True), None, T0 + timedelta(seconds=1))
    assert running.drain_requested()
    running.observe(None, None, T0 + timedelta(seconds=2))
    assert not running.drain_requested()


def _agent(agent_id: str, running: int = 0, not_claiming: str | None = None) -> AgentPresence:
    return AgentPresence(
        agent_id=agent_id,
        region="eu",
        capacity=1,
        running=running,
        version="1",
        last_seen=T0,
        interval_sec=30,
        not_claiming=not_claiming,
    )


def test_queue_reasons_with_pauses():
    now = T0 + timedelta(seconds=1)
    one, two = _agent("mac-1"), _agent("mac-2", running=1)
    assert agent_queue_reason([one, two], now, {}) is None
    # mac-1 paused by an operator (before it even said so): the busy mac-2 is the one left.
    assert agent_queue_reason([one, two], now, {"mac-1": _pause(60)}) is QueueReason.AGENT_BUSY
    assert agent_queue_reason([one], now, {"mac-1": _pause(60)}) is QueueReason.AGENT_PAUSED
    assert (
        agent_queue_reason([_agent("mac-1", not_claiming="agent_paused")], now, {})
        is QueueReason.AGENT_PAUSED
    )
    assert agent_queue_reason([one, two], now, {None: _pause(60, agent_id=None)}) is QueueReason.AGENT_PAUSED
    # An expired pause counts for nothing.
    assert agent_queue_reason([one], T0 + timedelta(seconds=61), {"mac-1": _pause(60)}) is None
    assert agent_queue_reason([], now, {None: _pause(60, agent_id=None)}) is QueueReason.AGENT_OFFLINE


@pytest.mark.parametrize(
    "text, seconds", [("90s", 90), ("5m", 300), ("2h", 7200), ("1d12h", 129600), ("45", 45), ("7d", 604800)]
)
def test_pause_durations(text: str, seconds: int):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["8d", "0", "2 hours", "h", "-5m", ""])
def test_pause_durations_refused(text: str):
    with pytest.raises(UserMistake, match="--timeout"):
        parse_duration(text)
