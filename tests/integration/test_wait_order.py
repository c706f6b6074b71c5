"""Priority order among jobs waiting for one project: job.asl.json's waiting order, on the
embedded stack (WaitOrderIndex, the lock's waiters, the sweep)."""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.intake.enqueue import enqueue, project_cache
from relevo_core.models.envelope import Trigger, TriggerType
from relevo_core.recovery.sweeper import sweep
from relevo_core.store import wait_order
from relevo_core.store.codec import from_attributes
from relevo_core.store.projects import get_project
from tests.helpers.stack import (
    job_execution_arn,
    receive_stage,
    register_project,
    table_items,
    wait_for_execution,
)
from tests.helpers.state_machine import agent_runs

STAGES = [{"name": "build", "run": "true"}]


def enqueue_job(stack, settings, project_id, priority: int) -> str:
    project_cache.clear()
    project = get_project(stack.table_name, project_id)
    commit = secrets.token_hex(20)
    trigger = Trigger(type=TriggerType.API, source="api")
    return enqueue(settings, project, trigger, "main", commit, commit, priority=priority).job_id


def _job(stack, job_id) -> dict:
    return {i["sk"]["S"]: from_attributes(i) for i in table_items(stack, f"JOB#{job_id}")}["JOB"]


def _wait_until_all_wait(stack, job_ids, timeout: float = 60) -> None:
    """Each job has been refused the lock and has taken its place in the waiting order."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = [_job(stack, job_id) for job_id in job_ids]
        if all(r.get("queue_reason") == "project_running" and r.get("waiting_for") for r in records):
            return
        time.sleep(0.2)
    raise AssertionError(f"not all waiting: {[(r['job_id'], r.get('queue_reason')) for r in records]}")


def _next_dispatched(stack, candidates: set[str], timeout: float = 60) -> dict:
    """The next stage message of any of these jobs (other jobs' messages are discarded)."""
    sqs = client("sqs")
    queue = stack.work_queues["eu-west"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
            body = json.loads(message["Body"])
            if body["job_id"] in candidates:
                return body
    raise TimeoutError(f"none of {sorted(candidates)} was dispatched within {timeout}s")


def _held_project_with_waiters(stack, settings, project_id, priorities: list[int]) -> tuple[dict, list[str]]:
    """One job holds the project (its stage dispatched, unanswered); then jobs of these priorities
    arrive in this order and wait. Returns the holder's stage message and the waiters' ids.

    The holder's stage waits for a claim: a generous queue timeout keeps a loaded test worker
    from timing it out (and freeing the project) while the waiters line up."""
    register_project(stack, project_id, STAGES, queue_timeout_sec=600)
    holder = enqueue_job(stack, settings, project_id, priority=0)
    holder_task, _ = receive_stage(stack, holder)
    waiters = [enqueue_job(stack, settings, project_id, priority=priority) for priority in priorities]
    _wait_until_all_wait(stack, waiters)
    return holder_task, waiters


def test_waiting_jobs_run_by_priority_then_queue_seq(local_stack, intake_settings, project_id):
    # Arrival order: low, mid, high, mid again.
    holder_task, arrivals = _held_project_with_waiters(
        local_stack, intake_settings, project_id, [0, 5, 10, 5]
    )
    low, mid, high, mid_later = arrivals
    seqs = [_job(local_stack, job_id)["queue_seq"] for job_id in arrivals]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    assert wait_order.waiting_jobs(local_stack.table_name, project_id) == [high, mid, mid_later, low]

    agent_runs(local_stack, holder_task)
    ran = []
    for _ in arrivals:
        task = _next_dispatched(local_stack, set(arrivals) - set(ran))
        ran.append(task["job_id"])
        agent_runs(local_stack, task)
        assert wait_for_execution(local_stack, task["job_id"], timeout=30)["status"] == "SUCCEEDED"

    assert ran == [high, mid, mid_later, low] != arrivals
    assert wait_order.waiting_jobs(local_stack.table_name, project_id) == []
    lock = from_attributes({i["sk"]["S"]: i for i in table_items(local_stack, f"LOCK#{project_id}")}["LOCK"])
    assert lock["count"] == 0 and "holders" not in lock and "waiters" not in lock


def test_canceled_and_ended_waiters_leave_the_order(local_stack, intake_settings, project_id):
    holder_task, (canceled, stopped, last) = _held_project_with_waiters(
        local_stack, intake_settings, project_id, [10, 5, 0]
    )
    assert wait_order.waiting_jobs(local_stack.table_name, project_id) == [canceled, stopped, last]

    RelevoApi.for_stack(local_stack).cancel_job(canceled)
    assert wait_order.waiting_jobs(local_stack.table_name, project_id) == [stopped, last]
    # An execution stopped from outside Relevo has no last state: only the sweep can drop it.
    client("stepfunctions").stop_execution(
        executionArn=job_execution_arn(local_stack, stopped), cause="operator abort"
    )
    assert wait_for_execution(local_stack, stopped, timeout=30)["status"] != "RUNNING"
    sweep(intake_settings, datetime.now(UTC))
    assert wait_order.waiting_jobs(local_stack.table_name, project_id) == [last]

    agent_runs(local_stack, holder_task)
    task = _next_dispatched(local_stack, {canceled, stopped, last})
    assert task["job_id"] == last
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, last, timeout=30)["status"] == "SUCCEEDED"


def test_a_priority_change_reorders_a_waiting_job(local_stack, intake_settings, project_id):
    holder_task, (first, second) = _held_project_with_waiters(
        local_stack, intake_settings, project_id, [5, 5]
    )
    assert wait_order.waiting_jobs(local_stack.table_name, project_id) == [first, second]

    wait_order.set_priority(local_stack.table_name, second, 50, "tester", datetime.now(UTC))

    assert wait_order.waiting_jobs(local_stack.table_name, project_id) == [second, first]
    assert _job(local_stack, second)["priority"] == 50
    agent_runs(local_stack, holder_task)
    for expected in (second, first):
        task = _next_dispatched(local_stack, {first, second})
        assert task["job_id"] == expected
        agent_runs(local_stack, task)
        assert wait_for_execution(local_stack, expected, timeout=30)["status"] == "SUCCEEDED"
