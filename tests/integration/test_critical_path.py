"""A stage handoff's critical path, counted (issue 47, point 1): every AWS call the agent and the
functions make from a stage message's receipt to its command's start, and from the command's end
to the next stage's message, recorded in order with which waits on which.

Given a two-stage job on the embedded stack and an agent in this process, with every request the
emulator serves recorded as it arrives and as it is answered (whose credentials: the agent's, the
claim function's role, the job's session, the state machine's role), and every request of the
agent to a claim route; each request held HOLD_SEC by the emulator before it is served, so that
two calls sent side by side are seen side by side (moto answers DynamoDB one request at a time,
and a request sent a millisecond after another would otherwise look like one sent after it),
when the agent takes the first stage and reports it, then the calls on the path are exactly
those bench/critical_path.py declares, each step sent only once the step before it was answered
and the calls of one step beside each other; the number of sequential round trips is a figure
written here (why each call is there: bench/critical_path.py).

Beside the path, not counted: functions the table's stream triggers (their own Lambda event
source, after the write: they never hold up the writer), and the calls the agent and the state
machine make beside the command (the run token's handing and the agent's look for it, the claimed
message's deletion, the lease's renewal).
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.critical_path import (
    AGENT,
    CLAIM_FUNCTION,
    END_TO_NEXT_MESSAGE,
    JOB_SESSION,
    RECEIPT_TO_START,
    STATE_MACHINE,
    Hop,
    round_trips,
)
from relevo_agent.claim import new_claim_secret
from relevo_agent.claim_routes import ClaimRoutes, RouteError
from relevo_agent.config import AgentConfig
from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_core.aws import client
from relevo_core.models.agent_session import ClaimRequest, OutcomeReport
from relevo_core.store import stage_attempts, task_tokens
from relevo_core.store.codec import from_attributes
from tests.helpers.agents import handle_received
from tests.helpers.stack import receive_stage, wait_until
from tests.helpers.state_machine import start_job
from tests.integration.test_agent_role import _routes

# Sequential round trips, receipt -> command start: the claim request (1), inside it the job's
# two partitions (1, side by side), the claim (1), the dispatch's answer beside the job's
# credentials (1).
RECEIPT_TO_START_ROUND_TRIPS = 4
# Command end -> next stage's message: the log's last lines stored while the attempt is held
# (1), the outcome request (1), inside it the run token read beside the outcome's fenced write
# (1), the run token answered (1); then the state machine: the next stage's record (1) and its
# message (1). (7 while the route read the claim on record before its write.)
END_TO_NEXT_ROUND_TRIPS = 6

HOLD_SEC = 0.1
# Who the emulator's credentials belong to: a role of the stack by its logical name.
ROLES = {"AgentSessionsRole": CLAIM_FUNCTION, "JobStateMachineRole": STATE_MACHINE, "JobRole": JOB_SESSION}
# Off the path by design, each beside the command (relevo_agent.dispatch.watch_for_run_token,
# relevo_agent.keeper, relevo_agent.logs): the state machine hands the run token once the dispatch
# is answered; the agent looks for it, then deletes the claimed message; the lease is renewed on
# its own clock.
BESIDE = {
    (STATE_MACHINE, "dynamodb:TransactWriteItems"),
    (JOB_SESSION, "dynamodb:GetItem"),
    (AGENT, "sqs:DeleteMessage"),
    (AGENT, "route:heartbeats"),
    (JOB_SESSION, "dynamodb:UpdateItem"),
}
ON_PATH = {AGENT, CLAIM_FUNCTION, STATE_MACHINE, JOB_SESSION}
# The embedded stack's stream poller runs in this process with the stack's own key, as the agent
# here does: on AWS it is Lambda's event source mapping, no caller's call.
STREAM_POLLER_CALLS = {
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
    "dynamodb:DescribeStream",
    "dynamodb:ListStreams",
}
# The first stage starts and prints, then waits for the test to let it end: by then everything
# beside its start (the run token's handing, the message's deletion, the log's first chunk with
# the read of where the log ends) is over. It prints again as it ends.
FIRST = (
    'echo "$EPOCHREALTIME" > "$RELEVO_JOB_ID-started"; echo building; '
    'while [ ! -e "$RELEVO_JOB_ID-go" ]; do sleep 0.01; done; echo built; '
    'echo "$EPOCHREALTIME" > "$RELEVO_JOB_ID-ended"'
)
STAGES = [{"name": "first", "run": FIRST}, {"name": "second", "run": "true"}]


@dataclass(frozen=True)
class Served:
    arrived: float
    answered: float
    who: str
    call: str
    # The request's body (its key, its message): whose job it is. Other jobs of the worker's stack
    # (earlier tests') may still be writing their records and sending their messages.
    body: str = ""


class Recording:
    """Every request the emulator serves and every claim route request of the agent, timed on
    this host's wall clock (the command's $EPOCHREALTIME is on it too)."""

    def __init__(self, agent_key: str) -> None:
        self.agent_key = agent_key
        self.served: list[Served] = []
        self.hold = False
        self._lock = threading.Lock()

    def who(self, access_key: str) -> str:
        from moto.sts.models import sts_backends

        if access_key == self.agent_key:
            return AGENT
        for backend in sts_backends[next(iter(sts_backends))].values():
            for role in backend.assumed_roles:
                if role.access_key_id == access_key:
                    name = role.role_arn.rsplit("/", 1)[-1]
                    return next((who for logical, who in ROLES.items() if f"-{logical}-" in name), name)
        return access_key

    def add(self, served: Served) -> None:
        with self._lock:
            self.served.append(served)

    def between(self, start: float, end: float) -> list[Served]:
        with self._lock:
            return sorted(
                (s for s in self.served if start <= s.arrived and s.answered <= end), key=lambda s: s.arrived
            )


def _call_of(environ: dict[str, Any]) -> tuple[str, str]:
    """(access key, service:action) of a request the emulator serves."""
    found = re.search(r"Credential=([^/]+)/[^/]+/[^/]+/([^/]+)/", environ.get("HTTP_AUTHORIZATION", ""))
    access_key, service = found.groups() if found else ("-", "-")
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target:
        return access_key, f"{service}:{target.rsplit('.', 1)[-1]}"
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)  # put back for moto
    action = re.search(rb"Action=(\w+)", body + environ.get("QUERY_STRING", "").encode())
    return access_key, f"{service}:{action.group(1).decode() if action else environ['REQUEST_METHOD']}"


@pytest.fixture()
def recording(local_stack, monkeypatch) -> Iterator[Recording]:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    recorded = Recording(local_stack.local_credentials.access_key_id)
    serve = DomainDispatcherApplication.__call__

    def served(app: Any, environ: dict[str, Any], start_response: Any) -> Any:
        arrived = time.time()
        access_key, call = _call_of(environ)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(raw)  # put back for moto
        body = raw.decode(errors="replace")
        if recorded.hold:
            time.sleep(HOLD_SEC)  # a request sent beside this one arrives meanwhile
        try:
            return serve(app, environ, start_response)
        finally:
            recorded.add(Served(arrived, time.time(), recorded.who(access_key), call, body))

    post = ClaimRoutes._post

    def routed(routes: ClaimRoutes, route: str, body: dict[str, Any]) -> dict[str, Any]:
        sent = time.time()
        try:
            return post(routes, route, body)
        finally:
            recorded.add(Served(sent, time.time(), AGENT, f"route:{route}"))

    monkeypatch.setattr(DomainDispatcherApplication, "__call__", served)
    monkeypatch.setattr(ClaimRoutes, "_post", routed)
    yield recorded


def hops_of(calls: list[Served]) -> list[tuple[str, str | None, list[list[str]]]]:
    """The recorded calls as hops: a route request with what its function called while it was
    open, and the calls each other caller made in a row (the state machine's, the Mac's own).
    Each hop's calls
    are grouped in steps: a call joins the step before it when it arrived before that step's
    calls were all answered (sent beside them), else it starts the next."""
    routes = [c for c in calls if c.call.startswith("route:")]

    def within(call: Served, route: Served) -> bool:
        return call.who == CLAIM_FUNCTION and route.arrived <= call.arrived <= route.answered

    hops: list[tuple[str, str | None, list[Served]]] = []
    for call in calls:
        if call in routes:
            hops.append((call.who, call.call.removeprefix("route:"), [c for c in calls if within(c, call)]))
        elif any(within(call, route) for route in routes):
            continue
        else:
            # The state machine's calls, or the Mac's own (not through a route), in a hop by who.
            if not hops or hops[-1][0] != call.who or hops[-1][1] is not None:
                hops.append((call.who, None, []))
            hops[-1][2].append(call)
    shaped = []
    for who, route, inside in hops:
        steps: list[list[Served]] = []
        for call in inside:
            if steps and call.arrived < max(c.answered for c in steps[-1]):
                steps[-1].append(call)
            else:
                steps.append([call])
        shaped.append((who, route, [sorted(c.call for c in step) for step in steps]))
    return shaped


def declared(path: tuple[Hop, ...]) -> list[tuple[str, str | None, list[list[str]]]]:
    return [(hop.who, hop.route, [sorted(step.calls) for step in hop.steps]) for hop in path]


def on_path(calls: list[Served], job_id: str) -> list[Served]:
    """The calls on this job's path: the state machine's only when they name this job (the
    worker's stack may still be running earlier tests' jobs, whose calls land in the window)."""
    return [
        c
        for c in calls
        if c.who in ON_PATH
        and (c.who, c.call) not in BESIDE
        and c.call not in STREAM_POLLER_CALLS
        and (c.who != STATE_MACHINE or job_id in c.body)
    ]


def test_a_handoff_waits_on_four_round_trips_to_start_and_six_to_hand_on(
    local_stack, project_id, tmp_path, recording
):
    # Given a two-stage job whose first stage's message was received, and an agent
    job_id = start_job(local_stack, project_id, STAGES)
    task, receipt = receive_stage(local_stack, job_id)
    workspace = tmp_path / "workspace"
    config = AgentConfig(
        agent_id="mac-path",
        region="eu-west",
        capacity=1,
        workspace_root=workspace,
        journal=tmp_path / "journal.sqlite3",
        prefer_previous_sec=0,
        handoff_max_wait_sec=0,
    )
    agent = Agent(
        config, local_stack.table_name, local_stack.work_queues["eu-west"], api_url=local_stack.api_url
    )
    message = Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"})

    # When the agent takes the stage (its command waits for the test once it started), then the
    # stage ends and the next stage's message is sent
    recording.hold = True
    received = time.time()
    stage = threading.Thread(target=handle_received, args=(agent, message), name="stage")
    stage.start()

    def marker(name: str) -> Path | None:
        return next(iter(workspace.rglob(f"{job_id}-{name}")), None)

    wait_until(lambda: marker("started") is not None, timeout=30)
    started_file = marker("started")
    assert started_file is not None
    # Everything beside the command's start is over: the claimed message was deleted, and the
    # log's first chunk stored.
    wait_until(
        lambda: {"sqs:DeleteMessage", "dynamodb:TransactWriteItems"}
        <= {c.call for c in recording.between(received, 1e12) if c.who in (AGENT, JOB_SESSION)},
        timeout=30,
    )
    (started_file.parent / f"{job_id}-go").touch()
    wait_until(
        lambda: any(
            c.who == STATE_MACHINE and c.call == "sqs:SendMessage" and job_id in c.body
            for c in recording.between(received, 1e12)
        ),
        timeout=30,
    )
    stage.join(30)
    recording.hold = False
    started = float(started_file.read_text())
    ended = float((started_file.parent / f"{job_id}-ended").read_text())
    to_start = on_path(recording.between(received, started), job_id)
    next_message = next(
        c
        for c in recording.between(ended, 1e12)
        if c.who == STATE_MACHINE and c.call == "sqs:SendMessage" and job_id in c.body
    )
    to_next = on_path(recording.between(ended, next_message.answered), job_id)

    # Then the calls are the declared ones, each step after the one before, beside within a step
    assert hops_of(to_start) == declared(RECEIPT_TO_START), to_start
    assert hops_of(to_next) == declared(END_TO_NEXT_MESSAGE), hops_of(to_next)
    # and the round trips in a row are the figures written here
    assert round_trips(RECEIPT_TO_START) == RECEIPT_TO_START_ROUND_TRIPS
    assert round_trips(END_TO_NEXT_MESSAGE) == END_TO_NEXT_ROUND_TRIPS
    # and the next stage's message is on the queue
    assert receive_stage(local_stack, job_id)[0]["stage_index"] == 1


def test_an_outcome_is_fenced_on_its_claim_by_its_write_with_no_read_before_it(local_stack, project_id):
    """The outcome route reads no claim on record before its write (one round trip fewer): the
    write's own condition names the claim (agent, attempt, the claim secret's hash, live), and
    what it found when refused says why (DynamoDB UpdateItem, ReturnValuesOnConditionCheckFailure:
    ALL_OLD, Amazon DynamoDB API Reference)."""
    # Given a stage claimed by mac-a through its region's claim route, its run token handed
    job_id = start_job(local_stack, project_id, STAGES)
    task, _ = receive_stage(local_stack, job_id)
    routes = _routes(local_stack, "eu-west")
    secret = new_claim_secret()
    attempt = {
        "job_id": job_id,
        "stage_index": task["stage_index"],
        "attempt": task["attempt"],
        "agent_id": "mac-a",
    }
    routes.claim(
        ClaimRequest(
            **attempt,
            claim_secret=secret,
            dispatch_key=task["dispatch_key"],
            dispatch_token=task["task_token"],
        )
    )
    wait_until(lambda: task_tokens.run_token(local_stack.table_name, job_id, 0) is not None, timeout=15)
    ref = stage_attempts.StageRef(local_stack.table_name, job_id, 0, task["attempt"], "mac-a")

    def record() -> dict[str, Any]:
        item = client("dynamodb").get_item(TableName=ref.table, Key=ref.key, ConsistentRead=True)["Item"]
        return from_attributes(item)

    def report(claim_secret: str, status: str) -> None:
        routes.report(
            OutcomeReport(
                **attempt,
                claim_secret=claim_secret,
                status=status,
                outcome=status,
                exit_code=0 if status == "succeeded" else 1,
                error=None if status == "succeeded" else "Relevo.Fatal.ExitCode",
            )
        )

    # When its agent and attempt report it under another secret
    with pytest.raises(RouteError) as forged:
        report(new_claim_secret(), "succeeded")
    # Then it is refused as not held, and nothing is written
    assert (forged.value.status, forged.value.code) == (409, "ATTEMPT_NOT_HELD")
    assert (record()["status"], record().get("ended_at")) == ("running", None)

    # When its own claim reports it failed, then succeeded
    report(secret, "failed")
    with pytest.raises(RouteError) as again:
        report(secret, "succeeded")
    # Then the first stands and the second is refused as ended, saying what it found
    assert (again.value.status, again.value.code) == (409, "ATTEMPT_ENDED")
    assert again.value.details.get("status") == "failed"
    assert record()["status"] == "failed"
