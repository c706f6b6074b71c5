"""The AWS calls of a command stage, counted (issue 44: "no new AWS call on the path of a stage
without an effect"). The agent's effect path (relevo_agent.effects, wired in a9c6900) must add
nothing to a stage that declares no effect: the figure below is the one the same test gives on
a9c6900's parent, before the wiring.

Given the real agent code handling one received stage message on this thread (as its poll hands
it to a stage thread), every AWS API call made through botocore and every claim route request
(SigV4-signed POSTs to API Gateway, relevo_agent.claim_routes) recorded by the thread that made
it, when a command stage with no effect runs from its message to its conclusion, then:

    the stage's own thread    the claim, then the outcome: two requests, no botocore call
    the run token's watcher   its polls of the stage record (GetItem, one per 50 ms until the
                              token is handed: a count of time, not of code) and the message's
                              one DeleteMessage
    any other agent thread    nothing
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from bench import harness
from relevo_agent.claim_routes import ClaimRoutes
from relevo_agent.messages import Message
from relevo_core.store.codec import from_attributes
from tests.helpers.agents import agent_at, handle_received
from tests.helpers.stack import job_items, receive_stage
from tests.helpers.state_machine import start_job

pytestmark = pytest.mark.timeout(120)

# The stage's own thread, in order.
STAGE_THREAD_CALLS = ["api:claims", "api:outcomes"]
# Every call of the agent's threads but the run token's polls, in any order.
AGENT_CALLS = Counter({"api:claims": 1, "api:outcomes": 1, "sqs:DeleteMessage": 1})
TOKEN_POLL = "dynamodb:GetItem"
# The agent's renewer of job sessions, started with its first stage and kept for its life.
JOB_SESSIONS_THREAD = "job-sessions"


class AgentCalls:
    """The calls of one thread (the stage's) and of every thread it or its threads start."""

    def __init__(self) -> None:
        self.stage_thread: int | None = None
        self.threads: list[threading.Thread] = []
        # (the thread's name, the call), and the stage thread's calls apart.
        self.calls: list[tuple[str, str]] = []
        self.stage_calls: list[str] = []
        self._lock = threading.Lock()

    def ours(self) -> bool:
        current = threading.current_thread()
        return current.ident == self.stage_thread or current in self.threads

    def add(self, call: str) -> None:
        if self.ours():
            with self._lock:
                self.calls.append((threading.current_thread().name, call))
                if threading.get_ident() == self.stage_thread:
                    self.stage_calls.append(call)


@pytest.fixture()
def agent_calls(monkeypatch) -> Iterator[AgentCalls]:
    calls = AgentCalls()
    post, start = ClaimRoutes._post, threading.Thread.start

    def counted_post(routes: ClaimRoutes, route: str, body: dict[str, Any]) -> dict[str, Any]:
        calls.add(f"api:{route}")
        return post(routes, route, body)

    def tracked_start(thread: threading.Thread) -> None:
        if calls.ours():
            calls.threads.append(thread)
        start(thread)

    monkeypatch.setattr(ClaimRoutes, "_post", counted_post)
    monkeypatch.setattr(threading.Thread, "start", tracked_start)
    restore = harness.record_aws_calls(
        lambda operation, _request, _result: calls.add(
            f"{operation.service_model.service_name}:{operation.name}"
        )
    )
    try:
        yield calls
    finally:
        restore()


def test_a_command_stage_makes_the_calls_it_made_before_effects_were_wired(
    local_stack, project_id, tmp_path, agent_calls
):
    # Given a job whose one stage runs a command and declares no effect, its message received
    # (a second, long enough for the run token's watcher to see the token handed)
    job_id = start_job(local_stack, project_id, [{"name": "build", "run": "sleep 1"}])
    agent = agent_at(tmp_path, local_stack, "mac-calls")
    task, receipt = receive_stage(local_stack, job_id, timeout=30)
    message = Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"})

    # When the agent handles it on this thread, to its conclusion
    agent_calls.stage_thread = threading.get_ident()
    handle_received(agent, message)
    agent_calls.stage_thread = None
    for thread in agent_calls.threads:
        if thread.name != JOB_SESSIONS_THREAD:
            thread.join(timeout=10)

    # Then the stage succeeded, with the calls it made before the effects were wired: the claim
    # and the outcome on its thread, the message deleted once beside it, nothing else but the
    # run token's polls
    stage = next(
        item
        for item in (from_attributes(raw) for raw in job_items(local_stack, job_id))
        if item.get("stage_name") == "build"
    )
    assert stage["status"] == "succeeded", stage
    assert agent_calls.stage_calls == STAGE_THREAD_CALLS, agent_calls.calls
    others = Counter(call for _, call in agent_calls.calls if call != TOKEN_POLL)
    assert others == AGENT_CALLS, agent_calls.calls
    polls = [name for name, call in agent_calls.calls if call == TOKEN_POLL]
    assert polls and set(polls) == {"token"}, agent_calls.calls
