"""Cancel in each phase, and a re-run from a later stage, on the embedded stack."""

from __future__ import annotations

import secrets
import time

import pytest
from botocore.exceptions import ClientError

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.aws import client
from relevo_core.store.codec import from_attributes
from tests.helpers.stack import (
    QueueSlots,
    job_items,
    receive_stage,
    register_project,
    table_items,
    wait_for_execution,
)
from tests.helpers.state_machine import agent_runs, claim_and_accept, wait_for_run_token

STAGES = [
    {"name": "build", "run": "true"},
    {"name": "sign", "run": "true"},
    {"name": "upload", "run": "true"},
]


def _job(stack, job_id):
    return {i["sk"]["S"]: from_attributes(i) for i in job_items(stack, job_id)}["JOB"]


def _run(api, project_id):
    return api.run_project(project_id, {"ref": "main", "commit": secrets.token_hex(20)})["job_id"]


def test_cancel_a_running_job_stops_it_refuses_its_heartbeats_and_frees_the_project(local_stack, project_id):
    register_project(local_stack, project_id, STAGES)
    api = RelevoApi.for_stack(local_stack)
    running = _run(api, project_id)
    task, _ = receive_stage(local_stack, running)
    token = wait_for_run_token(claim_and_accept(local_stack, task, "mac-a"))
    waiting = _run(api, project_id)  # held back by the project lock

    result = api.cancel_job(running)

    assert result == {"job_id": running, "status": "canceled", "was": "running"}
    assert _job(local_stack, running)["status"] == "canceled"
    assert wait_for_execution(local_stack, running, timeout=30)["status"] != "RUNNING"
    with pytest.raises(ClientError):  # what tells the agent to kill the stage's process group
        for _ in range(60):
            client("stepfunctions").send_task_heartbeat(taskToken=token)
            time.sleep(0.5)
    # The lock is free: the next job of the project runs.
    next_task, _ = receive_stage(local_stack, waiting, timeout=20)
    with pytest.raises(ApiError) as twice:
        api.cancel_job(running)
    assert (twice.value.status, twice.value.code) == (409, "JOB_ALREADY_ENDED")
    api.cancel_job(waiting)


def test_cancel_a_queued_job_gives_back_its_queue_slot_without_dispatch(local_stack, project_id):
    register_project(local_stack, project_id, STAGES)
    api = RelevoApi.for_stack(local_stack)
    holder = _run(api, project_id)
    receive_stage(local_stack, holder)
    queued = _run(api, project_id)
    for _ in range(50):
        if _job(local_stack, queued).get("queue_reason") == "project_running":
            break
        time.sleep(0.1)
    slots = QueueSlots(local_stack, project_id)

    assert api.cancel_job(queued)["was"] == "queued"

    assert slots.change() == -1
    assert _job(local_stack, queued)["status"] == "canceled"
    assert wait_for_execution(local_stack, queued, timeout=30)["status"] != "RUNNING"
    api.cancel_job(holder)


def test_rerun_from_a_stage_skips_the_earlier_ones_and_runs_the_rest(local_stack, project_id):
    register_project(local_stack, project_id, STAGES)
    api = RelevoApi.for_stack(local_stack)
    original = _run(api, project_id)
    task, _ = receive_stage(local_stack, original)
    agent_runs(local_stack, task)
    task, _ = receive_stage(local_stack, original)
    agent_runs(local_stack, task, succeed=False)
    assert wait_for_execution(local_stack, original)["status"] == "FAILED"

    rerun = api.rerun_job(original, "sign")["job_id"]

    for expected in ("sign", "upload"):
        task, _ = receive_stage(local_stack, rerun)
        assert task["stage"] == expected
        agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, rerun)["status"] == "SUCCEEDED"
    view = api.get_job(rerun)
    assert [(s["name"], s["status"], s["reused_from"]) for s in view["stages"]] == [
        ("build", "skipped", original),
        ("sign", "succeeded", None),
        ("upload", "succeeded", None),
    ]
    assert (view["from_stage"], view["retry_of"], view["last_successful_stage"]) == (
        "sign",
        original,
        "upload",
    )


def test_cancel_a_dispatched_stage_nobody_claimed(local_stack, project_id):
    register_project(local_stack, project_id, STAGES)
    api = RelevoApi.for_stack(local_stack)
    job_id = _run(api, project_id)
    for _ in range(100):  # the first stage is on the queue, unclaimed
        stage = {i["sk"]["S"]: from_attributes(i) for i in job_items(local_stack, job_id)}.get("STAGE#00", {})
        if stage.get("status") == "dispatched":
            break
        time.sleep(0.1)

    assert api.cancel_job(job_id)["was"] == "running"

    assert wait_for_execution(local_stack, job_id, timeout=30)["status"] != "RUNNING"
    assert _job(local_stack, job_id)["status"] == "canceled"


def test_cancel_a_job_waiting_at_its_approval_gate(local_stack, project_id):
    register_project(local_stack, project_id, STAGES, approval={"enabled": True, "before": "upload"})
    api = RelevoApi.for_stack(local_stack)
    job_id = _run(api, project_id)
    for _ in range(2):
        task, _ = receive_stage(local_stack, job_id)
        agent_runs(local_stack, task)
    for _ in range(100):
        if _job(local_stack, job_id)["status"] == "waiting":
            break
        time.sleep(0.1)

    assert api.cancel_job(job_id)["was"] == "waiting"

    # The execution is stopped (in AWS at once; moto 5.2.5 does not interrupt a task-token wait
    # that has no heartbeat, so its status is not asserted here). The job, the gate and the
    # project lock are what Relevo owns:
    assert _job(local_stack, job_id)["status"] == "canceled"
    lock = {i["sk"]["S"]: from_attributes(i) for i in table_items(local_stack, f"LOCK#{project_id}")}["LOCK"]
    assert not lock.get("holders")
    with pytest.raises(ApiError) as late:
        api.approve(job_id)
    assert late.value.code == "JOB_NOT_WAITING"
