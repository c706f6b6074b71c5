"""The retry placement decision of relevo-agent, on its own (no AWS)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from relevo_agent.presence import HANDOFF_MAX_RECEIVES, prefer_another
from relevo_core.store.agents import AgentPresence

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def _agent(agent_id: str, capacity: int = 1, running: int = 0, age_sec: float = 0, online: bool = True) -> AgentPresence:
    return AgentPresence(
        agent_id=agent_id,
        region="eu-west",
        capacity=capacity,
        running=running,
        version="0.1.0",
        last_seen=NOW - timedelta(seconds=age_sec),
        interval_sec=30,
        online=online,
    )


def _decide(avoid, region_agents, waited_sec: float = 0, receive_count: int = 1, agent_id: str = "mac-a"):
    chosen = prefer_another(agent_id, avoid, region_agents, NOW, waited_sec, receive_count, max_wait_sec=60)
    return chosen.agent_id if chosen else None


def test_an_agent_not_named_by_the_retry_takes_it():
    assert _decide([], [_agent("mac-b")]) is None
    assert _decide(["mac-b", ""], [_agent("mac-c")]) is None


def test_a_named_agent_leaves_it_to_the_freest_other_online_agent():
    region = [_agent("mac-a"), _agent("mac-b", capacity=2, running=1), _agent("mac-c", capacity=4, running=1)]
    assert _decide(["mac-a"], region) == "mac-c"


@pytest.mark.parametrize(
    "others",
    [
        [],  # alone in the region
        [_agent("mac-b", running=1)],  # the other is at capacity
        [_agent("mac-b", age_sec=91)],  # not seen for more than 3 intervals
        [_agent("mac-b", online=False)],  # stopped cleanly
    ],
)
def test_a_named_agent_falls_back_to_itself_when_no_other_is_online_and_free(others):
    assert _decide(["mac-a"], [_agent("mac-a"), *others]) is None


def test_agents_that_also_failed_the_stage_are_no_better():
    assert _decide(["mac-a", "mac-b"], [_agent("mac-b")]) is None
    assert _decide(["mac-a", "mac-b"], [_agent("mac-b"), _agent("mac-c")]) == "mac-c"


def test_the_wait_for_another_agent_is_bounded():
    free_other = [_agent("mac-b")]
    assert _decide(["mac-a"], free_other, waited_sec=59) == "mac-b"
    assert _decide(["mac-a"], free_other, waited_sec=60) is None
    assert _decide(["mac-a"], free_other, receive_count=HANDOFF_MAX_RECEIVES - 1) == "mac-b"
    assert _decide(["mac-a"], free_other, receive_count=HANDOFF_MAX_RECEIVES) is None
