"""A stage handoff's critical path, declared: every AWS call the agent and the functions make
from a stage message's receipt to its command's start, and from the command's end to the next
stage's message, in the order they wait on each other (issue 47, point 1).

`tests/integration/test_critical_path.py` records the calls of a real two-stage job on the
embedded stack and holds them to this declaration: the same calls, each step after the one
before it has ended, the calls of one step beside each other. `bench/agent.py` prints the count
of sequential round trips from here and an estimate on AWS from per-call latencies (below).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Who makes a call, as the emulator sees it by its credentials.
AGENT = "agent"  # the agent's own credentials (its queue, its claim routes)
CLAIM_FUNCTION = "claim function"  # AgentSessionsFunction, behind the claim routes
STATE_MACHINE = "state machine"  # the job state machine's service integrations
JOB_SESSION = "job session"  # the agent, with the credentials scoped to the job it claimed


@dataclass(frozen=True)
class Step:
    """Calls that go beside each other (one round trip's wait between them), and why they are
    there."""

    calls: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Hop:
    """One request on the path: `route` is the agent's request to an API route (a round trip
    from the Mac to the region), None for the state machine's own steps; `steps` are the calls
    made inside it, one after the other."""

    who: str
    route: str | None
    steps: tuple[Step, ...] = field(default_factory=tuple)

    @property
    def round_trips(self) -> int:
        return (1 if self.route else 0) + len(self.steps)


# From the stage message's receipt (a long poll of the region's queue answered) to the command's
# start: nothing on the Mac waits on AWS but the claim.
RECEIPT_TO_START = (
    Hop(
        AGENT,
        "claims",
        (
            Step(
                ("dynamodb:Query", "dynamodb:Query"),
                "the job's record and its stages' records, two partitions read side by side: the "
                "dispatch key, the envelope and what earlier stages left",
            ),
            Step(
                ("dynamodb:UpdateItem",),
                "the claim, fenced on the record just read (its attempt, dispatch key, lease)",
            ),
            Step(
                ("states:SendTaskSuccess", "sts:AssumeRole"),
                "the dispatch answered beside the job's credentials, minted only once the claim holds",
            ),
        ),
    ),
)

# From the command's end to the next stage's message on the region's queue, for a command that
# printed as it ran (its log's first chunk, and the read of where the log ends, were stored
# beside it) and printed again before it ended.
END_TO_NEXT_MESSAGE = (
    Hop(
        JOB_SESSION,
        None,
        (
            Step(
                ("dynamodb:TransactWriteItems",),
                "the log's last lines, stored while the attempt is still held (fenced on it): the "
                "report ends it (relevo_agent.conclude)",
            ),
        ),
    ),
    Hop(
        AGENT,
        "outcomes",
        (
            Step(
                ("dynamodb:GetItem", "dynamodb:UpdateItem"),
                "the attempt's run token read beside the outcome's write, which is fenced on the claim "
                "itself (this agent, attempt and claim secret's hash, live): no read of the claim first",
            ),
            Step(("states:SendTaskSuccess",), "the run token answered with the outcome"),
        ),
    ),
    Hop(
        STATE_MACHINE,
        None,
        (
            Step(("dynamodb:UpdateItem",), "the next stage's record written as dispatched"),
            Step(("sqs:SendMessage",), "the next stage's message, with its dispatch token"),
        ),
    ),
)

PATHS = {
    "receipt -> command start": RECEIPT_TO_START,
    "command end -> next stage's message": END_TO_NEXT_MESSAGE,
}


def round_trips(path: tuple[Hop, ...]) -> int:
    """Sequential round trips on `path`: each request from the Mac to a route, each step inside
    it, each call the Mac makes itself and each of the state machine's."""
    return sum(hop.round_trips for hop in path)


# ------------------------------------------------------------------------------------------------
# An estimate on AWS: the count times per-call latencies. Not a measurement. Per call, in ms,
# with where the figure comes from; where AWS publishes none, the figure is an assumption and
# says so.
LATENCY_MS: dict[str, tuple[float, str]] = {
    "direct": (
        25.0,
        "assumed: a Mac in or near the region to a regional service endpoint and back, the call "
        "itself included",
    ),
    "route": (
        40.0,
        "assumed: a Mac in or near the region to API Gateway and a warm Lambda and back "
        "(AWS publishes no figure for either's overhead)",
    ),
    "dynamodb": (
        10.0,
        "single-digit ms service-side (Amazon DynamoDB Developer Guide, 'What is Amazon "
        "DynamoDB'; AWS Database Blog, 'Understanding Amazon DynamoDB latency'), 10 ms end to end",
    ),
    "states": (20.0, "assumed: Step Functions publishes no API latency"),
    "sts": (20.0, "assumed: STS publishes no API latency (beside a Step Functions call here)"),
    "sqs": (
        20.0,
        "assumed: Amazon SQS publishes no latency figure ('low latency' in the SQS Developer Guide)",
    ),
}


def estimate_ms(path: tuple[Hop, ...]) -> float:
    """The path's time on AWS, estimated: each round trip at its slowest call's latency."""
    total = 0.0
    for hop in path:
        if hop.route:
            total += LATENCY_MS["route"][0]
        for step in hop.steps:
            if hop.route is None and hop.who != STATE_MACHINE:
                total += LATENCY_MS["direct"][0]  # the Mac's own call
            else:
                total += max(LATENCY_MS[call.split(":")[0]][0] for call in step.calls)
    return total
