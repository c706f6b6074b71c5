"""A task token is a capability (issue 41): no job session can read one or answer any task, and
the routes that answer for an agent check that it holds that very attempt. On the local stack with
IAM enforcement on and the credentials an agent really gets from its claim; each refusal asserted
by the error AWS (or the route) gives.

The holes these close, as they stood: a Mac that ran an earlier stage of a gated job read the
gate's token off the job record (its session's GetItem of JOB#) and approved its own job with
SendTaskSuccess (its session held states:SendTask* on "*"); and it could report a stage running on
another Mac as succeeded with that stage's run token, read off the stage record.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from relevo_agent.claim import new_claim_secret
from relevo_agent.claim_routes import RouteError
from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.models.agent_session import (
    ClaimRequest,
    HeartbeatRequest,
    JobSession,
    OutcomeReport,
    SessionRequest,
)
from relevo_core.store import stage_attempts, stage_claims, task_tokens
from relevo_core.store.codec import from_attributes
from tests.helpers.iam import refusal_code
from tests.helpers.stack import job_items, receive_stage, register_project, wait_for_execution, wait_until
from tests.integration.test_agent_role import _as_agent, _as_job, _routes

GATED = [{"name": "build", "run": "make"}, {"name": "upload", "run": "fastlane pilot"}]
REFUSED = "AccessDeniedException"


def _claim(stack, task: dict[str, Any], agent_id: str) -> tuple[JobSession, str]:
    """What relevo-agent does with a stage message: its region's claim route, the dispatch answered."""
    secret = new_claim_secret()
    granted = _routes(stack, "eu-west").claim(
        ClaimRequest(
            job_id=task["job_id"],
            stage_index=task["stage_index"],
            attempt=task["attempt"],
            agent_id=agent_id,
            claim_secret=secret,
            dispatch_key=task["dispatch_key"],
            dispatch_token=task["task_token"],
        )
    )
    assert granted.accepted is True
    ref = stage_attempts.StageRef(
        stack.table_name, task["job_id"], task["stage_index"], task["attempt"], agent_id
    )
    wait_until(lambda: stage_claims.run_handed(ref), 10, "the run token handed")
    return granted.session, secret


def _outcome(task: dict[str, Any], agent_id: str, secret: str, status: str = "succeeded") -> OutcomeReport:
    return OutcomeReport(
        job_id=task["job_id"],
        stage_index=task["stage_index"],
        attempt=task["attempt"],
        agent_id=agent_id,
        claim_secret=secret,
        status=status,
        outcome="succeeded" if status == "succeeded" else "failed",
        exit_code=0 if status == "succeeded" else 1,
        error=None if status == "succeeded" else "Relevo.Fatal.ExitCode",
    )


def _attempt(task: dict[str, Any], agent_id: str, secret: str) -> dict[str, Any]:
    return {
        "job_id": task["job_id"],
        "stage_index": task["stage_index"],
        "attempt": task["attempt"],
        "agent_id": agent_id,
        "claim_secret": secret,
    }


def _route_refusal(call) -> tuple[int, str | None]:
    with pytest.raises(RouteError) as refused:
        call()
    return refused.value.status, refused.value.code


def _job_record(stack, job_id: str) -> dict[str, Any]:
    return {item["sk"]["S"]: from_attributes(item) for item in job_items(stack, job_id)}["JOB"]


def _everything_the_session_reads(stack, session: JobSession, job_id: str) -> str:
    """Every item of the job's partitions the session may read, as text."""
    dynamodb = _as_job(stack, session, "dynamodb")
    found = []
    for pk in (f"JOB#{job_id}", f"STAGES#{job_id}"):
        found += dynamodb.query(
            TableName=stack.table_name,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": pk}},
            ConsistentRead=True,
        )["Items"]
    return json.dumps(found)


def test_a_mac_that_ran_an_earlier_stage_cannot_open_its_jobs_gate_and_the_job_waits_for_a_person(
    local_stack, project_id
):
    stack = local_stack
    register_project(stack, project_id, GATED, approval={"enabled": True, "before": "upload"})
    api = RelevoApi.for_stack(stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    # Given a Mac that claimed and finished the job's first stage, through its region's routes
    build, _ = receive_stage(stack, job_id)
    session, secret = _claim(stack, build, "mac-gate")
    _routes(stack, "eu-west").report(_outcome(build, "mac-gate", secret))
    wait_until(
        lambda: _job_record(stack, job_id).get("status") == "waiting", 20, "the job waiting at its gate"
    )
    gate = task_tokens.approval_token(stack.table_name, job_id)  # the test's own (unrestricted) read
    run = task_tokens.run_token(stack.table_name, job_id, 0)
    assert gate is not None and gate.stage == "upload" and run is not None

    # Then its job session reads no task token: not the job's token partition, with or without a
    # projection, by GetItem or Query ...
    dynamodb = _as_job(stack, session, "dynamodb")
    tokens = {"pk": {"S": f"TOKENS#{job_id}"}, "sk": {"S": "APPROVAL"}}
    assert refusal_code(lambda: dynamodb.get_item(TableName=stack.table_name, Key=tokens)) == REFUSED
    assert (
        refusal_code(
            lambda: dynamodb.get_item(
                TableName=stack.table_name,
                Key=tokens,
                ProjectionExpression="#t",
                ExpressionAttributeNames={"#t": "token"},
            )
        )
        == REFUSED
    )
    query = {
        "TableName": stack.table_name,
        "KeyConditionExpression": "pk = :pk",
        "ExpressionAttributeValues": {":pk": tokens["pk"]},
    }
    assert refusal_code(lambda: dynamodb.query(**query)) == REFUSED
    assert (
        refusal_code(
            lambda: dynamodb.query(
                **query, ProjectionExpression="#t", ExpressionAttributeNames={"#t": "token"}
            )
        )
        == REFUSED
    )
    # ... and nothing it may read (the job record, every stage record) carries one.
    readable = _everything_the_session_reads(stack, session, job_id)
    assert gate.token not in readable and run.token not in readable

    # And even a token come by some other way answers nothing: no task power on the job's session
    # or on the agent's own credentials.
    for sfn in (_as_job(stack, session, "stepfunctions"), _as_agent(stack, "eu-west", "stepfunctions")):
        assert (
            refusal_code(lambda sfn=sfn: sfn.send_task_success(taskToken=gate.token, output="{}")) == REFUSED
        )
        assert (
            refusal_code(lambda sfn=sfn: sfn.send_task_failure(taskToken=gate.token, error="x", cause="y"))
            == REFUSED
        )
        assert refusal_code(lambda sfn=sfn: sfn.send_task_heartbeat(taskToken=run.token)) == REFUSED

    # And its ended attempt gets no session, heartbeat or second answer through the routes.
    routes = _routes(stack, "eu-west")
    assert _route_refusal(lambda: routes.renew(SessionRequest(**_attempt(build, "mac-gate", secret)))) == (
        409,
        "ATTEMPT_ENDED",
    )
    assert _route_refusal(
        lambda: routes.heartbeat(HeartbeatRequest(**_attempt(build, "mac-gate", secret)))
    ) == (409, "ATTEMPT_ENDED")
    assert _route_refusal(lambda: routes.report(_outcome(build, "mac-gate", secret))) == (410, "TASK_GONE")

    # So the job still waits for a person; approved, it goes on and succeeds.
    time.sleep(1)
    assert _job_record(stack, job_id)["status"] == "waiting"
    api.approve(job_id, "release 1.4 signed off")
    upload, _ = receive_stage(stack, job_id)
    assert upload["stage"] == "upload"
    _, upload_secret = _claim(stack, upload, "mac-upload")
    _routes(stack, "eu-west").report(_outcome(upload, "mac-upload", upload_secret))
    assert wait_for_execution(stack, job_id)["status"] == "SUCCEEDED"


def test_a_mac_cannot_answer_a_stage_another_mac_runs(local_stack, project_id):
    stack = local_stack
    register_project(
        stack, project_id, [{"name": "build", "run": "make"}, {"name": "sign", "run": "make sign"}]
    )
    job_id = RelevoApi.for_stack(stack).run_project(project_id, {"ref": "main"})["job_id"]
    build, _ = receive_stage(stack, job_id)
    session_a, secret_a = _claim(stack, build, "mac-a")
    routes = _routes(stack, "eu-west")
    routes.report(_outcome(build, "mac-a", secret_a))
    # Given the next stage claimed and running on another Mac of the region
    sign, _ = receive_stage(stack, job_id)
    _, secret_b = _claim(stack, sign, "mac-b")
    run = task_tokens.run_token(stack.table_name, job_id, 1)
    assert run is not None and run.agent_id == "mac-b"

    # When the first Mac tries to report it as succeeded, or keep it alive, it is refused: by IAM
    # (its session holds no task power and cannot read the token) and by the routes (its claim
    # secret is not the one on the stage record).
    assert run.token not in _everything_the_session_reads(stack, session_a, job_id)
    sfn = _as_job(stack, session_a, "stepfunctions")
    assert refusal_code(lambda: sfn.send_task_success(taskToken=run.token, output="{}")) == REFUSED
    for agent_id in ("mac-a", "mac-b"):  # its own name, or the holder's: the secret is mac-b's alone
        forged = {**_attempt(sign, agent_id, secret_a)}
        assert _route_refusal(
            lambda forged=forged: routes.report(
                OutcomeReport(**forged, status="succeeded", outcome="succeeded")
            )
        ) == (409, "ATTEMPT_NOT_HELD")
        assert _route_refusal(lambda forged=forged: routes.heartbeat(HeartbeatRequest(**forged))) == (
            409,
            "ATTEMPT_NOT_HELD",
        )

    # Then the stage is still the other Mac's to end: running, and its own report ends the job.
    record = from_attributes(
        client("dynamodb").get_item(
            TableName=stack.table_name,
            Key=stage_attempts.StageRef(stack.table_name, job_id, 1, 1, "mac-b").key,
            ConsistentRead=True,
        )["Item"]
    )
    assert (record["status"], record["agent_id"]) == ("running", "mac-b")
    routes.heartbeat(HeartbeatRequest(**_attempt(sign, "mac-b", secret_b)))
    routes.report(_outcome(sign, "mac-b", secret_b))
    assert wait_for_execution(stack, job_id)["status"] == "SUCCEEDED"
