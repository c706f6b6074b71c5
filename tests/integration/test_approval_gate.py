"""The approval gate: approved, rejected and timed out, each notified exactly once through SNS,
with audit records for the operator's decisions."""

from __future__ import annotations

import json
import time

import pytest

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.aws import client
from relevo_core.store.audit import actions
from relevo_core.store.codec import from_attributes
from tests.helpers.stack import (
    job_items,
    receive_stage,
    register_project,
    subscribe_to_notifications,
    wait_for_execution,
)
from tests.helpers.state_machine import agent_runs

STAGES = [{"name": "build", "run": "make"}, {"name": "deploy-testflight", "run": "fastlane pilot"}]


@pytest.fixture()
def notifications(local_stack, project_id):
    """Every SNS notification of this project's jobs, through an SQS subscription."""
    sqs = client("sqs")
    queue_url = subscribe_to_notifications(local_stack, f"notify-{project_id}")

    def read(job_id: str, settle_sec: float = 1.0) -> list[str]:
        time.sleep(settle_sec)
        while True:
            batch = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get(
                "Messages", []
            )
            if not batch:
                break
            for message in batch:
                body = json.loads(message["Body"])
                read.seen.append(body)
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        return [event["event"] for event in read.seen if event["job_id"] == job_id]

    read.seen = []
    return read


def _job(stack, job_id):
    return {i["sk"]["S"]: from_attributes(i) for i in job_items(stack, job_id)}["JOB"]


def _start(stack, project_id, **approval) -> str:
    register_project(stack, project_id, STAGES, approval={"enabled": True, **approval})
    job_id = RelevoApi.for_stack(stack).run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(stack, job_id)
    agent_runs(stack, task)
    for _ in range(100):
        if _job(stack, job_id).get("status") == "waiting":
            return job_id
        time.sleep(0.1)
    raise AssertionError(f"job never waited: {_job(stack, job_id)}")


def test_an_approved_job_runs_the_gated_stage(local_stack, project_id, notifications):
    job_id = _start(local_stack, project_id)
    waiting = _job(local_stack, job_id)
    assert waiting["waiting_stage"] == "deploy-testflight"
    api = RelevoApi.for_stack(local_stack)

    decision = api.approve(job_id, "release 1.4 signed off")

    assert decision["action"] == "job.approve"
    task, _ = receive_stage(local_stack, job_id)
    assert task["stage"] == "deploy-testflight"
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    assert notifications(job_id) == ["job.waiting_for_approval"]
    # The gate is the condition of the stage's dispatch: refused until the approval was written on its record.
    gated = next(
        i
        for i in job_items(local_stack, job_id)
        if i["sk"]["S"] == "STAGE#01" and i["pk"]["S"].startswith("STAGES#")
    )
    assert gated["approved_at"]["S"] and gated["status"]["S"] == "succeeded"
    [audit] = actions(local_stack.table_name, job_id)
    assert (audit["action"], audit["reason"], audit["actor"].startswith("arn:aws:")) == (
        "job.approve",
        "release 1.4 signed off",
        True,
    )
    with pytest.raises(ApiError) as late:
        api.approve(job_id)
    assert (late.value.status, late.value.code) == (409, "JOB_NOT_WAITING")


def test_a_rejected_job_fails_without_dispatching_the_gated_stage(local_stack, project_id, notifications):
    job_id = _start(local_stack, project_id)

    RelevoApi.for_stack(local_stack).reject(job_id, "crash on launch in QA")

    described = wait_for_execution(local_stack, job_id)
    assert (described["status"], described["error"]) == ("FAILED", "Relevo.Approval.Rejected")
    assert _job(local_stack, job_id)["last_successful_stage"] == "build"
    assert notifications(job_id) == ["job.waiting_for_approval", "job.rejected"]
    assert [a["action"] for a in actions(local_stack.table_name, job_id)] == ["job.reject"]
    stages = {i["sk"]["S"] for i in job_items(local_stack, job_id)}
    assert "STAGE#01" not in stages  # nothing of the gated stage was dispatched


def test_an_unanswered_gate_times_out(local_stack, project_id, notifications):
    job_id = _start(local_stack, project_id, timeout_sec=2)

    described = wait_for_execution(local_stack, job_id, timeout=30)

    assert (described["status"], described["error"]) == ("FAILED", "Relevo.Approval.Timeout")
    assert json.loads(_job(local_stack, job_id)["error_cause"])["cause"] == "approval_timeout"
    assert notifications(job_id) == ["job.waiting_for_approval", "job.approval_timeout"]
