"""GET /jobs/{job_id}/cost: what a job's execution cost, counted from its Step Functions history
(relevo_core.jobs.cost), as the console's job summary shows it."""

from __future__ import annotations

import secrets

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.jobs import cost
from relevo_core.models.errors import ErrorCode, RelevoError
from tests.helpers.stack import job_execution_arn, receive_stage, register_project, wait_for_execution
from tests.helpers.state_machine import agent_runs


def _history(arn: str) -> list[dict]:
    events, kwargs = [], {"executionArn": arn}
    while True:
        page = client("stepfunctions").get_execution_history(**kwargs)
        events += page["events"]
        if not page.get("nextToken"):
            return events
        kwargs["nextToken"] = page["nextToken"]


def test_a_finished_jobs_cost_counts_its_transitions_and_the_requests_its_tasks_made(local_stack, project_id):
    register_project(
        local_stack, project_id, [{"name": "build", "run": "true"}, {"name": "sign", "run": "true"}]
    )
    api = RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main", "request_id": secrets.token_hex(4)})["job_id"]
    for _ in range(2):
        task, _ = receive_stage(local_stack, job_id)
        agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

    answer = api.job_cost(job_id)

    events = _history(job_execution_arn(local_stack, job_id))
    entered = [e for e in events if e["type"].endswith("StateEntered")]
    assert answer["transitions"] == len(entered) > 0
    # Each stage was handed to the region's queue once (no retry): one SendMessage per stage.
    assert answer["sqs_requests"] == 2
    assert answer["dynamodb_writes"] > 0
    # bench/cost.py's budget, exactly: 3 transitions per stage + 2 per job on the success path
    # (intake took the project's lock: the job's execution starts at RunStages).
    assert answer["transitions"] == 2 * 3 + 2
    expected = (
        answer["transitions"] * cost.SFN_PER_TRANSITION
        + answer["lambda_invocations"] * cost.LAMBDA_PER_REQUEST
        + answer["dynamodb_reads"] * cost.DDB_PER_RRU
        + answer["dynamodb_writes"] * cost.DDB_PER_WRU
        + answer["sqs_requests"] * cost.SQS_PER_REQUEST
    )
    assert answer["dollars"] == pytest.approx(expected)
    assert "not the agent's" in answer["basis"]


def test_a_job_with_no_execution_is_refused_with_a_code(local_stack):
    # GetExecutionHistory answers ExecutionDoesNotExist for a name never started; the API
    # answers 409 JOB_NOT_STARTED rather than a 5xx.
    with pytest.raises(RelevoError) as refused:
        cost.job_cost(local_stack.machines, "job_" + secrets.token_hex(8))
    assert (refused.value.code, refused.value.status) == (ErrorCode.JOB_NOT_STARTED, 409)
