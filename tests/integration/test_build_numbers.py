"""Build numbers given once (RELEVO_BUILD_NUMBER, relevo_core.store.build_numbers) on the local stack:
per project, in order, once per job, with no gap, the same on every attempt, stage, rerun and
redrive of a job, and never given to two jobs.

The local stack applies DynamoDB actions one at a time, so jobs that allocate at the same instant
meet each other as AWS would have them: a refused condition on the counter (another job took the
number first), answered from the refusal's ALL_OLD item. AWS's other answer to overlapping
transactions, TransactionConflict (Developer Guide, "Transaction conflict handling in DynamoDB"),
is injected (relevo_local.moto.dynamodb_faults).
"""

from __future__ import annotations

import json
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

from bench import harness
from relevo_agent.claim import new_claim_secret
from relevo_cli.api import RelevoApi
from relevo_core.aws import client, in_this_context
from relevo_core.intake.enqueue import build_envelope, project_cache
from relevo_core.models.envelope import Trigger, TriggerType
from relevo_core.models.status import HeldReason, StageStatus
from relevo_core.store import build_numbers, job_creation, stage_attempts
from relevo_core.store.projects import get_project
from relevo_local.moto import dynamodb_faults
from tests.helpers.stack import job_record, receive_stage, register_project, wait_for_execution
from tests.helpers.state_machine import start_job, wait_for_run_token

BUILD = [{"name": "build", "run": "true"}]


def _held_jobs(stack, settings, project_id: str, count: int, **project: Any) -> list[str]:
    """`count` jobs of a project with build numbers, written by intake's own transaction (held:
    they take no queue slot and start no execution, so only their build numbers are at stake)."""
    register_project(stack, project_id, BUILD, build_number={"stages": ["build"], **project})
    project_cache.clear()
    registered = get_project(stack.table_name, project_id)
    jobs = []
    for _ in range(count):
        commit = secrets.token_hex(20)
        now = datetime.now(UTC)
        envelope = build_envelope(
            settings,
            registered,
            Trigger(type=TriggerType.API, source="api"),
            "main",
            commit,
            registered.frozen_stages(),
            f"{project_id}:{commit}",
            now,
        )
        outcome = job_creation.create_job(
            stack.table_name, envelope, 60, 1000, now, held_reason=HeldReason.FORK_PULL_REQUEST
        )
        assert isinstance(outcome, job_creation.Created)
        jobs.append(envelope.job_id)
    return jobs


def _allocate_all(table: str, project_id: str, jobs: list[str], **kwargs: Any) -> list[int]:
    """Every job's allocation at once, each on a thread of its own."""
    start = threading.Barrier(len(jobs))

    def allocate(job_id: str) -> int:
        start.wait()
        return build_numbers.allocate(table, project_id, job_id, **kwargs)

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return list(pool.map(in_this_context(allocate), jobs))


def test_twenty_jobs_allocating_at_once_take_one_to_twenty_once_each(
    local_stack, intake_settings, project_id
):
    # Given twenty jobs of one project, none with a number yet
    jobs = _held_jobs(local_stack, intake_settings, project_id, 20)

    # When all of them ask for one at the same instant, each asked twice (two shards of one stage)
    numbers = _allocate_all(local_stack.table_name, project_id, jobs + jobs)

    # Then the twenty jobs hold 1..20, one number each, no gap, and a job's two asks got its one
    assert numbers[:20] == numbers[20:], numbers
    assert sorted(numbers[:20]) == list(range(1, 21)), numbers
    assert [job_record(local_stack, job_id)["build_number"] for job_id in jobs] == numbers[:20]
    # and the counter moved exactly as many times as numbers were given
    assert build_numbers.last_number(local_stack.table_name, project_id) == 20


def test_a_floor_starts_the_numbers_and_never_brings_them_back(local_stack, intake_settings, project_id):
    # Given a project whose numbers start at 1200 (the App Store's latest was 1199), twenty jobs
    jobs = _held_jobs(local_stack, intake_settings, project_id, 22, floor=1200)
    table = local_stack.table_name

    # When they take their numbers at once
    numbers = _allocate_all(table, project_id, jobs[:20], floor=1200)

    # Then they hold 1200..1219
    assert sorted(numbers) == list(range(1200, 1220)), numbers
    # and a lower floor never gives a number again, a higher one skips ahead
    assert build_numbers.allocate(table, project_id, jobs[20], floor=5) == 1220
    assert build_numbers.allocate(table, project_id, jobs[21], floor=3000) == 3000
    assert build_numbers.last_number(table, project_id) == 3000


def test_two_projects_count_apart(local_stack, intake_settings, project_id):
    # Given two projects with jobs of their own
    ours = _held_jobs(local_stack, intake_settings, project_id, 3)
    theirs = _held_jobs(local_stack, intake_settings, f"{project_id}-b", 2)

    # When their jobs take numbers, interleaved
    table = local_stack.table_name
    given = [
        build_numbers.allocate(table, project_id, ours[0]),
        build_numbers.allocate(table, f"{project_id}-b", theirs[0]),
        build_numbers.allocate(table, project_id, ours[1]),
        build_numbers.allocate(table, f"{project_id}-b", theirs[1]),
        build_numbers.allocate(table, project_id, ours[2]),
    ]

    # Then each project counts its own from 1
    assert given == [1, 1, 2, 2, 3]


def test_a_transaction_conflict_is_tried_again_and_gives_one_number(local_stack, intake_settings, project_id):
    # Given a job, and DynamoDB cancelling its allocation twice for a transaction on its items
    [job_id] = _held_jobs(local_stack, intake_settings, project_id, 1)
    slept: list[float] = []

    # When it asks for its number
    with dynamodb_faults.transaction_conflicts(2, ("JOB#", "BUILDNUMBERS#")) as injected:
        number = build_numbers.allocate(local_stack.table_name, project_id, job_id, sleep=slept.append)

    # Then it is tried again after a backoff each time, and takes 1, once
    assert len(injected.failed) == 2 and len(slept) == 2, (injected.failed, slept)
    assert number == 1 and build_numbers.last_number(local_stack.table_name, project_id) == 1


def test_a_job_that_is_gone_gets_no_number_and_moves_no_counter(local_stack, project_id):
    # Given no such job
    with pytest.raises(Exception, match="JOB_NOT_FOUND|no job"):
        build_numbers.allocate(local_stack.table_name, project_id, "job_" + "0" * 26)
    # Then nothing was counted
    assert build_numbers.last_number(local_stack.table_name, project_id) is None


# ------------------------------------------------------------------ through the claim route


@pytest.fixture()
def claim_handler(local_stack) -> Any:
    role = client("iam").get_role(RoleName=local_stack.resources["AgentSessionsRole"])["Role"]["Arn"]
    harness.use_function_environment(local_stack, "AgentSessionsFunction")  # conftest restores os.environ
    with harness.as_role(role):
        handler = harness.cold_handler("agent_sessions")
    return role, handler


def _run(stack, claim_handler, job_id: str, succeed: bool = True, error: str = "") -> dict[str, Any]:
    """The job's next stage message claimed through the claim route, as relevo-agent claims it,
    then ended; returns the claim's answer."""
    role, handler = claim_handler
    task, _ = receive_stage(stack, job_id, timeout=30)
    body = {
        "job_id": job_id,
        "stage_index": task["stage_index"],
        "attempt": task["attempt"],
        "agent_id": "mac-numbers",
        "claim_secret": new_claim_secret(),
        "dispatch_key": task["dispatch_key"],
        "dispatch_token": task["task_token"],
    }
    event = harness.claim_event("eu-west", body, "arn:aws:sts::123456789012:assumed-role/agent/mac-numbers")
    with harness.as_role(role):
        response = handler.lambda_handler(event, harness.LambdaContext())
    assert response["statusCode"] == 200, response
    granted = json.loads(response["body"])
    ref = stage_attempts.StageRef(
        stack.table_name, job_id, task["stage_index"], task["attempt"], "mac-numbers"
    )
    token = wait_for_run_token(ref)
    sfn, now = client("stepfunctions"), datetime.now(UTC)
    if succeed:
        stage_attempts.finish(ref, StageStatus.SUCCEEDED, now, 0, None)
        sfn.send_task_success(taskToken=token, output=json.dumps({"agent_id": "mac-numbers"}))
    else:
        stage_attempts.finish(ref, StageStatus.FAILED, now, 2, error)
        sfn.send_task_failure(taskToken=token, error=error, cause=json.dumps({"exit_code": 2}))
    return {"stage": task["stage"], "attempt": task["attempt"], "build_number": granted.get("build_number")}


@pytest.mark.timeout(240)
def test_a_job_keeps_its_number_on_a_retry_every_stage_a_rerun_and_a_redrive(
    local_stack, project_id, claim_handler
):
    # Given a project whose build stage needs a build number and whose sign stage does not
    stages = [
        {"name": "prepare", "run": "true"},
        {"name": "build", "run": "true"},
        {"name": "sign", "run": "true"},
    ]
    job_id = start_job(
        local_stack,
        project_id,
        stages,
        build_number={"stages": ["build"]},
        retry={"backoff_base_sec": 0},
    )
    table = local_stack.table_name

    # When its stages are claimed: prepare, build failing once (transient), build again, then sign
    # failing for good (the job is dead-lettered)
    ran = [
        _run(local_stack, claim_handler, job_id),
        _run(local_stack, claim_handler, job_id, succeed=False, error="Relevo.Transient.ExitCode"),
        _run(local_stack, claim_handler, job_id),
        _run(local_stack, claim_handler, job_id, succeed=False, error="Relevo.Fatal.ProfileMismatch"),
    ]
    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"

    # Then the stage before the first that needs one ran without a number, and every claim from the
    # build stage's first on had the job's one: the retry, and the later stage that lists none
    assert [(r["stage"], r["attempt"], r["build_number"]) for r in ran] == [
        ("prepare", 1, None),
        ("build", 1, 1),
        ("build", 2, 1),
        ("sign", 1, 1),
    ]

    # When the job is rerun from its build stage, and redriven from its failed stage
    api = RelevoApi.for_stack(local_stack)
    rerun = api.rerun_job(job_id, "build")["job_id"]
    # Then the rerun's record carries the number from its creation, and its claims get it
    assert job_record(local_stack, rerun)["build_number"] == 1
    assert [_run(local_stack, claim_handler, rerun)["build_number"] for _ in range(2)] == [1, 1]
    assert wait_for_execution(local_stack, rerun)["status"] == "SUCCEEDED"
    redriven = api.redrive(job_id)["job_id"]
    assert job_record(local_stack, redriven)["build_number"] == 1
    assert _run(local_stack, claim_handler, redriven)["build_number"] == 1
    assert wait_for_execution(local_stack, redriven)["status"] == "SUCCEEDED"

    # and the project gave one number in all: the next job of the project takes 2
    assert build_numbers.last_number(table, project_id) == 1
    # and the job view and the job list say each job's number
    assert [api.get_job(job)["build_number"] for job in (job_id, rerun, redriven)] == [1, 1, 1]
    listed = {job["job_id"]: job.get("build_number") for job in api.list_jobs(project=project_id)["jobs"]}
    assert listed == {job_id: 1, rerun: 1, redriven: 1}, listed
