"""Same-project serial: job.asl.json's project lock, on the embedded stack."""

from __future__ import annotations

from datetime import UTC, datetime

from relevo_core.aws import client
from relevo_core.recovery.sweeper import sweep
from tests.helpers.stack import (
    job_execution_arn,
    receive_stage,
    register_project,
    table_items,
    wait_for_execution,
)
from tests.helpers.state_machine import agent_runs, enqueue_job

STAGES = [{"name": "build", "run": "true"}]


def _job(stack, job_id):
    return {i["sk"]["S"]: i for i in table_items(stack, f"JOB#{job_id}")}["JOB"]


def _no_stage_message_for(stack, job_id, seconds: float) -> bool:
    try:
        receive_stage(stack, job_id, region="eu-west", timeout=seconds)
    except TimeoutError:
        return True
    return False


def test_two_jobs_of_one_project_never_overlap_while_other_projects_run(
    local_stack, intake_settings, project_id
):
    other_project = project_id + "-b"
    register_project(local_stack, project_id, STAGES)
    register_project(local_stack, other_project, STAGES)
    first = enqueue_job(local_stack, intake_settings, project_id)
    first_task, _ = receive_stage(local_stack, first)

    second = enqueue_job(local_stack, intake_settings, project_id)
    elsewhere = enqueue_job(local_stack, intake_settings, other_project)

    # Another project is not held back.
    elsewhere_task, _ = receive_stage(local_stack, elsewhere)
    agent_runs(local_stack, elsewhere_task)
    # The second job of the busy project waits, and says why.
    assert _no_stage_message_for(local_stack, second, 4)
    waiting = _job(local_stack, second)
    assert (waiting["status"]["S"], waiting["queue_reason"]["S"]) == ("queued", "project_running")

    agent_runs(local_stack, first_task)
    assert wait_for_execution(local_stack, first)["status"] == "SUCCEEDED"
    second_task, _ = receive_stage(
        local_stack, second, timeout=60
    )  # the waiter polls the lock every lease/3; the emulator is slow under a loaded worker
    started = _job(local_stack, second)
    assert started["status"]["S"] == "running" and "queue_reason" not in started
    agent_runs(local_stack, second_task)
    assert wait_for_execution(local_stack, second)["status"] == "SUCCEEDED"
    lock = {i["sk"]["S"]: i for i in table_items(local_stack, f"LOCK#{project_id}")}["LOCK"]
    assert lock["count"]["N"] == "0" and "holders" not in lock


def test_the_sweep_frees_the_lock_of_a_stopped_execution(local_stack, intake_settings, project_id):
    register_project(local_stack, project_id, STAGES)
    stuck = enqueue_job(local_stack, intake_settings, project_id)
    receive_stage(local_stack, stuck)
    client("stepfunctions").stop_execution(
        executionArn=job_execution_arn(local_stack, stuck), cause="operator abort"
    )
    # The emulator ends a stopped execution that waits for a task token within about ten seconds.
    assert wait_for_execution(local_stack, stuck, timeout=30)["status"] != "RUNNING"
    waiting = enqueue_job(local_stack, intake_settings, project_id)
    assert _no_stage_message_for(local_stack, waiting, 3)

    report = sweep(intake_settings, datetime.now(UTC))

    assert f"{project_id}:{stuck}" in report.locks_freed
    task, _ = receive_stage(local_stack, waiting, timeout=60)
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, waiting)["status"] == "SUCCEEDED"


def test_a_job_that_finds_the_lock_free_but_others_waiting_joins_the_line(
    local_stack, intake_settings, project_id
):
    """A free lock stores no holders at all. A job refused because others wait (here one whose
    execution already ended, so the line is only the lock's record of it) must read that as "not
    held by me" and queue, not fail on the missing attribute; heading the waiting order, it runs."""
    register_project(local_stack, project_id, STAGES)
    client("dynamodb").put_item(
        TableName=local_stack.table_name,
        Item={
            "pk": {"S": f"LOCK#{project_id}"},
            "sk": {"S": "LOCK"},
            "kind": {"S": "lock"},
            "count": {"N": "0"},
            "waiters": {"SS": ["job_" + "0" * 26]},
        },
    )

    job_id = enqueue_job(local_stack, intake_settings, project_id)

    task, _ = receive_stage(local_stack, job_id, timeout=30)
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
