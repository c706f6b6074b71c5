"""statemachines/job.asl.json itself, executing in the emulator's Step Functions interpreter,
driven by an agent double that makes the real SQS, DynamoDB and task-token calls."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts, stage_claims
from tests.helpers.stack import history, job_items, receive_stage, wait_for_execution
from tests.helpers.state_machine import agent_runs, start_job

# The success path's budget (issue 31, bench/cost.py): 3 transitions per stage plus 3 per job.
STAGE_STATES = ("MarkStageDispatched", "DispatchStage", "AwaitResult")
# The job took its project's free lock at intake: its execution starts at its stages (job_run.asl.json).
JOB_STATES = ("RunStages", "ReleaseLockAndMarkSucceeded")


def _job_record(stack, job_id):
    items = job_items(stack, job_id)
    return {item["sk"]["S"]: item for item in items}


def test_stages_run_in_order_and_the_job_record_mirrors_the_execution(local_stack, project_id):
    job_id = start_job(local_stack, project_id)

    for expected in ("build", "sign"):
        task, _ = receive_stage(local_stack, job_id)
        assert (task["job_id"], task["stage"]) == (job_id, expected)
        agent_runs(local_stack, task)

    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    records = _job_record(local_stack, job_id)
    job = records["JOB"]
    assert job["status"]["S"] == "succeeded"
    assert job["last_successful_stage"]["S"] == "sign"
    assert job["last_writer"]["S"] == f"state_machine:{job_id}"
    assert [records[f"STAGE#0{i}"]["status"]["S"] for i in (0, 1)] == ["succeeded", "succeeded"]
    assert records["STAGE#00"]["agent_id"]["S"] == "double-1"

    entered = [
        e["stateEnteredEventDetails"]["name"]
        for e in history(local_stack, job_id)
        if e["type"].endswith("StateEntered")
    ]
    print(f"\nstate transitions: {len(entered)} for 2 stages: {' > '.join(entered)}")
    assert entered == [JOB_STATES[0], *STAGE_STATES, *STAGE_STATES, JOB_STATES[1]]


def test_a_failed_stage_fails_the_job_and_dead_letters_it_with_its_last_good_stage(local_stack, project_id):
    job_id = start_job(local_stack, project_id)
    task, _ = receive_stage(local_stack, job_id)
    agent_runs(local_stack, task)
    task, _ = receive_stage(local_stack, job_id)

    agent_runs(local_stack, task, succeed=False)

    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    job = _job_record(local_stack, job_id)["JOB"]
    assert job["status"]["S"] == "failed"
    assert job["error_name"]["S"] == "Relevo.Fatal.ExitCode", job.get("error_cause")
    assert job["last_successful_stage"]["S"] == "build"
    dead = []
    for _ in range(20):
        for message in (
            client("sqs")
            .receive_message(
                QueueUrl=local_stack.resources["JobDeadLetterQueue"],
                MaxNumberOfMessages=10,
                WaitTimeSeconds=1,
            )
            .get("Messages", [])
        ):
            body = json.loads(message["Body"])
            if body["job_id"] == job_id:
                dead.append(body)
        if dead:
            break
    assert dead and dead[0]["error"] == "Relevo.Fatal.ExitCode" and dead[0]["project"] == project_id
    entry = dead[0]
    # Everything needed to resume without logging into a Mac:
    assert entry["envelope"]["job_id"] == job_id and entry["envelope"]["stages"][1]["command"] == "make sign"
    assert entry["job_record"]["last_successful_stage"] == {"S": "build"}
    detail = json.loads(entry["cause"])
    assert (detail["stage"], detail["error_class"], detail["attempts"], detail["retry_count"]) == (
        "sign",
        "Relevo.Fatal.ExitCode",
        1,
        0,
    )
    assert detail["cumulative_backoff_sec"] == 0
    # The agent's cause (exit code, agent) is passed on, as on AWS (the local stack passes
    # SendTaskFailure's cause on: relevo_local.moto.stepfunctions).
    assert detail["cause"] == '{"exit_code": 2, "agent_id": "double-1"}'

    assert entry["artifacts"].startswith("s3://") and entry["logs"] == f"/jobs/{job_id}/logs"


def test_a_zombie_cannot_overwrite_its_successor(local_stack, project_id):
    """Fencing: once attempt 2 holds the stage, attempt 1's writes are refused."""
    job_id = start_job(local_stack, project_id, stages=[{"name": "upload", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    now = datetime.now(UTC)
    first = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-a")
    second = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-b")
    stage_claims.claim(first, 10, now)

    stage_claims.claim(second, 10, now)

    import pytest

    with pytest.raises(stage_attempts.LeaseLost):
        stage_attempts.finish(first, StageStatus.SUCCEEDED, now, 0, None)
    with pytest.raises(stage_attempts.LeaseLost):
        stage_attempts.renew_lease(first, 10, now)
    with pytest.raises(stage_attempts.LeaseLost):
        stage_claims.claim(stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-a"), 10, now)
    stage = _job_record(local_stack, job_id)["STAGE#00"]
    assert (stage["agent_id"]["S"], stage["attempt"]["N"], stage["status"]["S"]) == ("mac-b", "2", "running")
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")
