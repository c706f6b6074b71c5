"""The claim route's work, counted (issue 29, point 2: the stage handoff): what `bench/agent.py
--only handoff` times, held here as counts, so that a call, a client built or a thread started
on the way from a stage message to its command cannot slip back unnoticed.

Given functions/agent_sessions/handler.py called in this process as Lambda would call it, in the
claim function's deployed environment and as its role, with every AWS API call of the request's
thread and of the process's side-by-side pool (relevo_core.aws.side_by_side) recorded through
botocore (bench/harness.py), when an agent claims a dispatched stage, then:

    a claim at a warm container   the job's two partitions read (Query, side by side), the claim
                                  (UpdateItem), then the dispatch answered (SendTaskSuccess) beside
                                  the job's session (AssumeRole): five calls, three one after the
                                  other, no thread started
    a refused claim               no AssumeRole: the session is minted once the claim holds
    the first claim of a new      no client built: the function's init built them (AWS: "Initialize
    container                     SDK clients ... outside of the function handler", Lambda Developer
                                  Guide, Best practices for working with AWS Lambda functions)
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from bench import harness
from relevo_agent.claim import new_claim_secret
from relevo_core import aws
from relevo_core.aws import client
from tests.helpers.stack import receive_stage
from tests.helpers.state_machine import start_job

STAGES = [{"name": "build", "run": "true"}]
# Per claim, in any order: each read and the mint run on a pool thread.
CLAIM_CALLS = sorted(
    [
        "dynamodb:Query",
        "dynamodb:Query",
        "dynamodb:UpdateItem",
        "sts:AssumeRole",
        "stepfunctions:SendTaskSuccess",
    ]
)
# On the request's own thread: the claim, then the answer to the dispatch once it has landed.
REQUEST_THREAD_CALLS = ["dynamodb:UpdateItem", "stepfunctions:SendTaskSuccess"]


class RouteCalls:
    """The AWS calls made by one thread (the request's) and by the side-by-side pool's threads."""

    def __init__(self) -> None:
        self.request_thread: int | None = None
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def on_call(self, operation_model: Any, request_dict: Any, result: Any) -> None:
        thread = threading.current_thread()
        if self.request_thread is not None and (
            thread.ident == self.request_thread or thread.name.startswith("side-by-side")
        ):
            with self._lock:
                who = "request" if thread.ident == self.request_thread else "pool"
                self.calls.append(
                    (who, f"{operation_model.service_model.service_name}:{operation_model.name}")
                )


@pytest.fixture()
def recorded() -> Iterator[RouteCalls]:
    calls = RouteCalls()
    restore = harness.record_aws_calls(calls.on_call)
    try:
        yield calls
    finally:
        restore()


def _dispatched(stack, project_id: str, count: int) -> list[dict[str, Any]]:
    """`count` jobs whose first stage the state machine dispatched, as claim request bodies."""
    bodies = []
    for index in range(count):
        job_id = start_job(stack, f"{project_id}-{index}", STAGES)
        task, _ = receive_stage(stack, job_id)
        bodies.append(
            {
                "job_id": job_id,
                "stage_index": task["stage_index"],
                "attempt": task["attempt"],
                "agent_id": "mac-count",
                "claim_secret": new_claim_secret(),
                "dispatch_key": task["dispatch_key"],
                "dispatch_token": task["task_token"],
            }
        )
    return bodies


def _claim(handler: Any, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    event = harness.claim_event("eu-west", body, "arn:aws:sts::123456789012:assumed-role/agent/mac-count")
    response = handler.lambda_handler(event, harness.LambdaContext())
    assert response["statusCode"] == status, response
    return response


@pytest.fixture()
def claim_role(local_stack) -> str:
    role = client("iam").get_role(RoleName=local_stack.resources["AgentSessionsRole"])["Role"]["Arn"]
    harness.use_function_environment(
        local_stack, "AgentSessionsFunction"
    )  # conftest puts os.environ back after
    return role


def test_a_new_containers_first_claim_builds_no_client(local_stack, project_id, claim_role, monkeypatch):
    [body] = _dispatched(local_stack, project_id, 1)
    built: list[str] = []
    build = boto3.session.Session.client

    def counted_build(session: Any, service: str, *args: Any, **kwargs: Any) -> Any:
        # The clients relevo_core builds (the emulator, in this process too, builds its own).
        if sys._getframe(1).f_code.co_filename == aws.__file__:
            built.append(service)
        return build(session, service, *args, **kwargs)

    with harness.as_role(claim_role):
        handler = harness.cold_handler("agent_sessions")  # its init builds the clients it uses
        monkeypatch.setattr(boto3.session.Session, "client", counted_build)
        _claim(handler, body)
        monkeypatch.setattr(boto3.session.Session, "client", build)
    assert built == [], built


def test_a_warm_claim_makes_five_calls_three_in_a_row_and_starts_no_thread(
    local_stack, project_id, claim_role, recorded, monkeypatch
):
    first, second = _dispatched(local_stack, project_id, 2)
    started: list[str] = []
    start = threading.Thread.start

    def counted_start(thread: threading.Thread) -> None:
        # The route's own starts: the emulator's server, in this process too, starts one per request.
        caller = threading.current_thread()
        if caller.ident == recorded.request_thread or caller.name.startswith("side-by-side"):
            started.append(thread.name)
        start(thread)

    with harness.as_role(claim_role):
        handler = harness.cold_handler("agent_sessions")
        _claim(handler, first)  # the container is warm, and so is the pool
        monkeypatch.setattr(threading.Thread, "start", counted_start)
        recorded.request_thread = threading.get_ident()
        _claim(handler, second)
        recorded.request_thread = None
        monkeypatch.setattr(threading.Thread, "start", start)

    calls = [call for _, call in recorded.calls]
    assert sorted(calls) == CLAIM_CALLS, calls
    assert [call for who, call in recorded.calls if who == "request"] == REQUEST_THREAD_CALLS
    assert started == [], started


def test_a_refused_claim_mints_no_session(local_stack, project_id, claim_role, recorded):
    """The claim of an attempt another claim holds (here: the same attempt again, under another
    secret, while the first claim's lease runs) is refused before any AssumeRole."""
    [body] = _dispatched(local_stack, project_id, 1)
    with harness.as_role(claim_role):
        handler = harness.cold_handler("agent_sessions")
        _claim(handler, body)
        recorded.request_thread = threading.get_ident()
        refused = _claim(
            handler, {**body, "agent_id": "mac-other", "claim_secret": new_claim_secret()}, status=409
        )
        recorded.request_thread = None
    assert "CLAIM_REFUSED" in refused["body"], refused
    calls = [call for _, call in recorded.calls]
    assert "sts:AssumeRole" not in calls and "dynamodb:UpdateItem" in calls, calls


def test_the_claim_that_gives_a_build_number_adds_two_calls_beside_the_mint_and_the_next_none(
    local_stack, project_id, claim_role, recorded
):
    """A stage that needs the job's build number (fleet/build_numbers): its first claim reads the
    project's counter and takes the number in one transaction, on the pool beside the mint (the
    request's own thread makes the same two calls as ever); a later claim of the job finds the
    number on the job record it reads anyway, and makes no call for it."""
    # Given a job whose only stage needs a build number
    job_id = start_job(local_stack, project_id, STAGES, build_number={"stages": ["build"]})
    task, _ = receive_stage(local_stack, job_id)
    body = {
        "job_id": job_id,
        "stage_index": task["stage_index"],
        "attempt": task["attempt"],
        "agent_id": "mac-count",
        "claim_secret": new_claim_secret(),
        "dispatch_key": task["dispatch_key"],
        "dispatch_token": task["task_token"],
    }
    with harness.as_role(claim_role):
        handler = harness.cold_handler("agent_sessions")
        # When it is claimed, and claimed again (its answer lost: the same claim sent again)
        recorded.request_thread = threading.get_ident()
        first = _claim(handler, {**body, "accept": False})
        given = list(recorded.calls)
        recorded.calls.clear()
        again = _claim(handler, {**body, "accept": False})
        recorded.request_thread = None

    # Then the first claim gave 1 with two more calls, both on the pool
    assert sorted(call for _, call in given) == sorted(
        [
            "dynamodb:Query",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
            "sts:AssumeRole",
            "dynamodb:GetItem",
            "dynamodb:TransactWriteItems",
        ]
    ), given
    assert [call for who, call in given if who == "request"] == ["dynamodb:UpdateItem"]
    # and the second found it on the job record: no call for it
    assert '"build_number": 1' in first["body"] and '"build_number": 1' in again["body"]
    assert not {"dynamodb:GetItem", "dynamodb:TransactWriteItems"} & {call for _, call in recorded.calls}


def test_the_bench_runs_a_function_as_one_warm_environment_with_its_session_and_clients_kept(
    local_stack, claim_role
):
    """bench/cost.py prices each claim and outcome as an invocation of a warm execution
    environment: Lambda hands an environment its role's credentials once, and the clients built
    with them serve every invocation after. A new session and new clients per invocation billed
    each outcome 130-340 ms of client building that Lambda never spends."""
    import os

    from relevo_core.aws import client as aws_client

    # Given two invocations of the claim function as one warm environment, with the process's own
    # calls (the agent double's) between them
    with harness.as_role(claim_role, warm=True):
        first_key, first_client = os.environ["AWS_ACCESS_KEY_ID"], aws_client("dynamodb")
    own_key = os.environ["AWS_ACCESS_KEY_ID"]
    with harness.as_role(claim_role, warm=True):
        second_key, second_client = os.environ["AWS_ACCESS_KEY_ID"], aws_client("dynamodb")
    # Then the second runs with the first's session and its client, and the process's own calls in
    # between kept their own credentials
    assert second_key == first_key != own_key
    assert second_client is first_client
    # And a cold environment each time gets a new session and new clients
    with harness.as_role(claim_role):
        cold_key, cold_client = os.environ["AWS_ACCESS_KEY_ID"], aws_client("dynamodb")
    assert cold_key != first_key
    assert cold_client is not first_client
