"""A shard asks for its test plan again while the plans route gives no answer
(relevo_agent.shard_tests.ask_for_plan): no answer or a 5xx is asked again, the waits doubling,
for a bounded time on the agent's own clock; a refusal is final at once; past the budget the
attempt fails as a retryable network failure; a stop while waiting ends the wait. The clock and
the waits are the test's: nothing sleeps."""

from __future__ import annotations

from typing import Any

import pytest

from relevo_agent import shard_tests
from relevo_agent.claim_routes import RouteError, RouteUnreachable
from relevo_agent.shard_tests import PlanWaitStopped, ShardTestsFailed, ask_for_plan
from relevo_core.models.agent_session import PlanGranted, PlanRequest
from relevo_core.models.errors import ErrorClass

REQUEST = PlanRequest(
    job_id="job_" + "x" * 26,
    stage_index=0,
    shard=1,
    attempt=1,
    agent_id="mac-1",
    claim_secret="a" * 64,
    listing_sha256="0" * 64,
)
GRANTED = PlanGranted(
    plan_key="p/k.json",
    plan_sha256="1" * 64,
    listing_sha256="0" * 64,
    by="count",
    tests=2,
    expected_sec=0,
    made_now=True,
)


class Clock:
    """The agent's monotonic clock, moved only by the waits it is asked for."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []
        self.stop_on_wait: int | None = None

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return self.stop_on_wait is not None and len(self.waits) >= self.stop_on_wait


class Routes:
    """The plans route answering with each of `answers` in turn: an exception is raised."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def plan(self, request: PlanRequest) -> PlanGranted:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_plans_route_that_did_not_answer_is_asked_again_until_it_does():
    # Given a plans route that twice gives no answer (a reset, then API Gateway's 502), then answers
    clock = Clock()
    routes = Routes(
        RouteUnreachable("POST /plans: connection reset"),
        RouteUnreachable("POST /plans: HTTP 502"),
        GRANTED,
    )
    # When the shard asks for its plan
    granted = ask_for_plan(routes, REQUEST, clock.wait, clock=clock)
    # Then it has the plan from the third call, after waits of 0.5 s and 1 s on its own clock
    assert granted == GRANTED and routes.calls == 3
    assert clock.waits == [shard_tests.PLAN_RETRY_SEC, 2 * shard_tests.PLAN_RETRY_SEC]


def test_a_5xx_the_route_itself_answered_is_asked_again_and_a_refusal_is_not():
    clock = Clock()
    # Given the route's own 500 once, then its plan
    routes = Routes(RouteError(500, "INTERNAL", "the plan could not be stored"), GRANTED)
    assert ask_for_plan(routes, REQUEST, clock.wait, clock=clock) == GRANTED
    assert routes.calls == 2
    # And a refusal (this shard listed other tests): raised at the first call, never asked again
    refused = Routes(RouteError(409, "TEST_LISTING_DIFFERS", "shard 0 listed other tests"))
    with pytest.raises(RouteError) as raised:
        ask_for_plan(refused, REQUEST, clock.wait, clock=clock)
    assert raised.value.code == "TEST_LISTING_DIFFERS" and refused.calls == 1


def test_a_route_that_never_answers_fails_the_attempt_as_a_retryable_network_failure_within_the_budget():
    # Given a plans route that never answers
    clock = Clock()
    began = clock.now
    routes = Routes(RouteUnreachable("POST /plans: timed out"))
    # When the shard asks for its plan
    with pytest.raises(ShardTestsFailed) as failed:
        ask_for_plan(routes, REQUEST, clock.wait, budget_sec=20, clock=clock)
    # Then it gives up within the budget: a network failure, which the retry policy retries,
    # naming how many calls went unanswered and the last one's words
    assert failed.value.error_class is ErrorClass.NETWORK_TIMEOUT and failed.value.error_class.retryable
    assert clock.now - began <= 20
    assert clock.waits == [0.5, 1.0, 2.0, 4.0, 8.0]  # doubling, at most PLAN_RETRY_MAX_SEC
    assert routes.calls == 6 and failed.value.cause["calls"] == 6
    assert "did not answer in 20s" in failed.value.message and "timed out" in failed.value.message


def test_an_attempt_stopped_while_it_waits_for_the_route_stops_asking():
    # Given a plans route that does not answer, and the attempt fenced during the second wait
    clock = Clock()
    clock.stop_on_wait = 2
    routes = Routes(RouteUnreachable("POST /plans: timed out"))
    # When the shard asks for its plan, then it stops there, after two calls
    with pytest.raises(PlanWaitStopped):
        ask_for_plan(routes, REQUEST, clock.wait, clock=clock)
    assert routes.calls == 2
