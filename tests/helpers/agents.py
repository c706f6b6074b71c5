"""Driving an in-process Agent (relevo_agent.service) the way its own loops do."""

from __future__ import annotations

from relevo_agent.messages import Message
from relevo_agent.service import Agent


def handle_received(agent: Agent, message: Message) -> None:
    """`message` handled on this thread as the poll hands a received one to its stage thread: a
    slot held before the receive and started with the thread, which ends it (relevo_agent.slots)."""
    assert agent.slots.hold(0), "the agent has no free slot"
    agent.slots.started()
    agent._handle(message)
