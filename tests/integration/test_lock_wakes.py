"""A job waiting for its project is woken when the project is freed, by whoever frees it: the
releasing execution, cancel, and the sweeper. Each waiter here reads the lock on its own only
every 36 s (queue_timeout_sec 3600, see execution.lock_wait), so a waiter that starts within a few
seconds of the release was woken."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.execution import lock_wait
from relevo_core.recovery.sweeper import sweep
from tests.helpers.stack import (
    history,
    job_execution_arn,
    job_record,
    receive_stage,
    register_project,
    wait_for_execution,
    wait_until,
)
from tests.helpers.state_machine import agent_runs, enqueue_job

STAGES = [{"name": "build", "run": "true"}]
QUEUE_TIMEOUT_SEC = 3600
# Well under the fallback read period: only a wake starts the waiter this soon.
WOKEN_WITHIN_SEC = 12


def _parked(stack, job_id: str) -> bool:
    entered = [
        e["stateEnteredEventDetails"]["name"]
        for e in history(stack, job_id)
        if e["type"].endswith("StateEntered")
    ]
    return bool(entered) and entered[-1] == "WaitForProject"


def _holder_and_parked_waiter(stack, settings, project_id) -> tuple[dict, str]:
    assert lock_wait(QUEUE_TIMEOUT_SEC)["fallback_sec"] > 2 * WOKEN_WITHIN_SEC
    register_project(stack, project_id, STAGES, queue_timeout_sec=QUEUE_TIMEOUT_SEC)
    holder = enqueue_job(stack, settings, project_id)
    holder_task, _ = receive_stage(stack, holder)
    waiter = enqueue_job(stack, settings, project_id)
    wait_until(
        lambda: job_record(stack, waiter).get("wake_token") and _parked(stack, waiter), 60, f"{waiter} parked"
    )
    return holder_task, waiter


def _started_within(stack, job_id: str, since: float) -> dict:
    task, _ = receive_stage(stack, job_id, timeout=WOKEN_WITHIN_SEC)
    assert time.monotonic() - since < WOKEN_WITHIN_SEC
    return task


def test_the_releasing_execution_wakes_the_head_of_the_line(local_stack, intake_settings, project_id):
    holder_task, waiter = _holder_and_parked_waiter(local_stack, intake_settings, project_id)

    released = time.monotonic()
    agent_runs(local_stack, holder_task)

    task = _started_within(local_stack, waiter, released)
    woken = [
        e
        for e in history(local_stack, waiter)
        if e["type"] == "TaskSucceeded"
        and e["taskSucceededEventDetails"].get("resource") == "transactWriteItems.waitForTaskToken"
    ]
    assert woken, "the waiter's park did not return with a wake"
    assert "wake_token" not in job_record(local_stack, waiter)
    # Someone waited, so the holder's one-transaction end was refused and it went the long way.
    holder = holder_task["job_id"]
    assert wait_for_execution(local_stack, holder)["status"] == "SUCCEEDED"
    ended = [
        e["stateEnteredEventDetails"]["name"]
        for e in history(local_stack, holder)
        if e["type"].endswith("StateEntered")
    ]
    assert ended[ended.index("ReleaseLockAndMarkSucceeded") :] == [
        "ReleaseLockAndMarkSucceeded",
        "ReleaseLockAndMarkSucceededCanceled",
        "ReleaseProjectLock",
        "FindHeadToWake",
        "IsAnyoneWaiting",
        "ReadHeadWakeToken",
        "HasWakeToken",
        "WakeHead",
        "AfterWake",
        "MarkSucceeded",
    ]
    assert job_record(local_stack, holder)["status"] == "succeeded"
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, waiter)["status"] == "SUCCEEDED"


def test_cancel_wakes_the_head_of_the_line(local_stack, intake_settings, project_id):
    holder_task, waiter = _holder_and_parked_waiter(local_stack, intake_settings, project_id)

    canceled = time.monotonic()
    RelevoApi.for_stack(local_stack).cancel_job(holder_task["job_id"])

    task = _started_within(local_stack, waiter, canceled)
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, waiter)["status"] == "SUCCEEDED"


def test_the_sweeper_wakes_the_head_of_the_line_when_it_frees_a_stopped_holder(
    local_stack, intake_settings, project_id
):
    holder_task, waiter = _holder_and_parked_waiter(local_stack, intake_settings, project_id)
    holder = holder_task["job_id"]
    sfn = client("stepfunctions")
    sfn.stop_execution(executionArn=job_execution_arn(local_stack, holder), cause="operator abort")
    assert wait_for_execution(local_stack, holder, timeout=30)["status"] == "ABORTED"

    swept = time.monotonic()
    report = sweep(intake_settings, datetime.now(UTC))

    assert f"{project_id}:{holder}" in report.locks_freed
    task = _started_within(local_stack, waiter, swept)
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, waiter)["status"] == "SUCCEEDED"
