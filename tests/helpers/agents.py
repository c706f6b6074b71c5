"""Driving an in-process Agent (relevo_agent.service) the way its own loops do."""

from __future__ import annotations

from pathlib import Path

from relevo_agent.config import AgentConfig
from relevo_agent.messages import Message
from relevo_agent.service import Agent


def agent_at(tmp_path: Path, stack, agent_id: str, region: str = "eu-west") -> Agent:
    """An agent of capacity 1 in `region` of the local stack, its workspace and journal under
    `tmp_path`, that runs what it claims here: no wait for the previous Mac, and a retry not left
    to another agent (the presences earlier tests left on the worker's stack look online, and
    placement.leave_to_another would otherwise leave it to one of them)."""
    config = AgentConfig(
        agent_id=agent_id,
        region=region,
        capacity=1,
        workspace_root=tmp_path / agent_id,
        journal=tmp_path / f"{agent_id}.sqlite3",
        max_clock_skew_sec=0.5,
        prefer_previous_sec=0,
        handoff_max_wait_sec=0,
    )
    return Agent(config, stack.table_name, stack.work_queues[region], api_url=stack.api_url)


def handle_received(agent: Agent, message: Message) -> None:
    """`message` handled on this thread as the poll hands a received one to its stage thread: a
    slot held before the receive and started with the thread, which ends it (relevo_agent.slots)."""
    assert agent.slots.hold(0), "the agent has no free slot"
    agent.slots.started()
    agent._handle(message)
