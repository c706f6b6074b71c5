"""A job's state machine driven by the test playing the agent's part: claim (fenced), accept,
heartbeat, record and report, as relevo-agent does with one stage message."""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime

from relevo_core.aws import client
from relevo_core.intake.enqueue import enqueue, project_cache
from relevo_core.models.envelope import Trigger, TriggerType
from relevo_core.models.status import StageStatus
from relevo_core.projects.lock_handoff import wake_next_waiter
from relevo_core.store import locks, stage_attempts, task_tokens
from relevo_core.store.projects import get_project
from tests.helpers.payloads import push_body
from tests.helpers.stack import deliver, register_project

TWO_STAGES = [{"name": "build", "run": "make build"}, {"name": "sign", "run": "make sign"}]


def agent_runs(
    stack, task, succeed: bool = True, agent_id: str = "double-1", error: str = "Relevo.Fatal.ExitCode"
) -> None:
    """What relevo-agent does with one message: claim (fenced), accept, run, record, report."""
    ref = claim_and_accept(stack, task, agent_id)
    run_token = wait_for_run_token(ref)
    sfn = client("stepfunctions")
    sfn.send_task_heartbeat(taskToken=run_token)
    now = datetime.now(UTC)
    if succeed:
        stage_attempts.finish(ref, StageStatus.SUCCEEDED, now, 0, None)
        sfn.send_task_success(taskToken=run_token, output=json.dumps({"agent_id": agent_id}))
    else:
        stage_attempts.finish(ref, StageStatus.FAILED, now, 2, error)
        sfn.send_task_failure(
            taskToken=run_token, error=error, cause=json.dumps({"exit_code": 2, "agent_id": agent_id})
        )


def claim_and_accept(stack, task, agent_id: str, lease_ttl_sec: int = 10) -> stage_attempts.StageRef:
    ref = stage_attempts.StageRef(
        stack.table_name, task["job_id"], task["stage_index"], task["attempt"], agent_id
    )
    stage_attempts.claim(ref, lease_ttl_sec, datetime.now(UTC))
    client("stepfunctions").send_task_success(
        taskToken=task["task_token"], output=json.dumps({"agent_id": agent_id, "attempt": task["attempt"]})
    )
    return ref


def wait_for_run_token(ref: stage_attempts.StageRef, timeout: float = 10) -> str:
    """The run token the state machine handed `ref`'s claim, read from the job's token partition
    with the test's own (unrestricted) credentials: the claim routes' read, which no agent makes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        token = task_tokens.run_token(ref.table, ref.job_id, ref.stage_index, ref.shard)
        if token is not None and (token.agent_id, token.attempt) == (ref.agent_id, ref.attempt):
            assert stage_attempts.run_handed(ref), "the stage record says when the run token was handed"
            return token.token
        time.sleep(0.05)
    raise TimeoutError("no run token")


def start_job(stack, project_id, stages=TWO_STAGES, **project) -> str:
    secret = register_project(stack, project_id, stages, **project)
    response = deliver(stack, project_id, push_body(f"acme/{project_id}", secrets.token_hex(20)), secret)
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def enqueue_job(stack, settings, project_id) -> str:
    project_cache.clear()
    project = get_project(stack.table_name, project_id)
    commit = secrets.token_hex(20)
    return enqueue(
        settings, project, Trigger(type=TriggerType.API, source="api"), "main", commit, commit
    ).job_id


# An execution name no execution has: a lock it holds stays held until the test lets it go.
OUTSIDE_HOLDER = "job_" + "0" * 25 + "h"


def hold_outside(stack, project_id: str) -> None:
    client("dynamodb").put_item(
        TableName=stack.table_name,
        Item={
            "pk": {"S": f"LOCK#{project_id}"},
            "sk": {"S": "LOCK"},
            "kind": {"S": "lock"},
            "count": {"N": "1"},
            "holders": {"SS": [OUTSIDE_HOLDER]},
        },
    )


def release_outside(stack, project_id: str) -> None:
    """Let the lock go the way cancel and the sweeper do, waking the head of the line."""
    assert locks.release(stack.table_name, project_id, OUTSIDE_HOLDER)
    wake_next_waiter(stack.table_name, project_id)


def gate_outside(stack, project_id: str, since: str) -> None:
    """The outside holder of the lock waits at its approval gate, as AwaitApproval says it on the lock."""
    client("dynamodb").update_item(
        TableName=stack.table_name,
        Key={"pk": {"S": f"LOCK#{project_id}"}, "sk": {"S": "LOCK"}},
        UpdateExpression="SET gate = :gate ADD wake_seq :one",
        ExpressionAttributeValues={
            ":gate": {
                "M": {"job_id": {"S": OUTSIDE_HOLDER}, "stage": {"S": "upload"}, "since": {"S": since}}
            },
            ":one": {"N": "1"},
        },
    )


def answer_gate_outside(stack, project_id: str) -> None:
    """The outside holder's gate is answered: the lock no longer says it, as MarkApproved leaves it."""
    client("dynamodb").update_item(
        TableName=stack.table_name,
        Key={"pk": {"S": f"LOCK#{project_id}"}, "sk": {"S": "LOCK"}},
        UpdateExpression="REMOVE gate ADD wake_seq :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )
