"""Transaction conflicts in job.asl.json, injected on the emulator.

On AWS a TransactWriteItems that overlaps another write of one of its items is cancelled:
`DynamoDb.TransactionCanceledException` in the state machine (Step Functions names an AWS SDK
integration's error ServiceName.ErrorName), the item's cancellation reason `TransactionConflict`
in the message Step Functions gives as the Cause (DynamoDB API Reference, TransactWriteItems,
Errors). It never fails as `TransactionConflictException`, so a Retry on that name never
matches. The local stack applies DynamoDB actions one at a time and never conflicts: these
tests switch the conflict on (relevo_local.moto.dynamodb_faults) for each transactional state, and check
that the state retries it, that the job's status and its queue slot (the COUNTER# item) stay
right, and that a real condition failure still goes where it went.

The Cause the states read: moto 5.2.5's interpreter gives DynamoDB's message and the request's
details, "Transaction cancelled, please refer cancellation reasons for specific reasons
[TransactionConflict, None] (Service: DynamoDb, Status Code: 400, Request ID: ...)". AWS's message
is the same sentence with the same bracketed list of reasons, one per item in request order
(DynamoDB API Reference, CancellationReason; AWS Knowledge Center, "Why does my TransactWriteItems
API call fail": "... specific reasons [ConditionalCheckFailed, None, None, None] (Service: ...").
The states match only inside that list (`*TransactionConflict*`, `*, ConditionalCheckFailed]*`),
never on the details after it, which differ between SDKs.
"""

from __future__ import annotations

import secrets
import uuid
from datetime import UTC, datetime

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.execution import start_execution, work_queue_url
from relevo_core.intake.enqueue import build_envelope, project_cache
from relevo_core.models.envelope import Trigger, TriggerType
from relevo_core.models.status import JobStatus
from relevo_core.store import job_creation, job_status, queue_counter
from relevo_core.store.projects import get_project
from relevo_local.moto import dynamodb_faults
from tests.helpers.stack import (
    QueueSlots,
    history,
    job_execution_arn,
    job_record,
    lock_record,
    receive_stage,
    register_project,
    table_items,
    wait_for_execution,
    wait_until,
)
from tests.helpers.state_machine import agent_runs, enqueue_job, hold_outside, release_outside
from tests.integration.test_manual_review import _stage, _to_manual_review

STAGES = [{"name": "build", "run": "true"}]
# The partition-key prefixes of each transactional state's items, in the order the state names them.
ACQUIRE_PROJECT_LOCK_AND_START = ("LOCK#", "JOB#", "COUNTER#")
MARK_STARTED = ("JOB#", "COUNTER#")
MARK_WAITING_FOR_PROJECT = ("JOB#", "LOCK#")
ACQUIRE_AS_QUEUE_HEAD = ("LOCK#", "JOB#")
RECORD_RESOLVED_SUCCEEDED = ("STAGES#", "JOB#")
# WaitForProject's park names the same items as AcquireAsQueueHead; its first is a ConditionCheck.
WAIT_FOR_PROJECT, PARK = ("LOCK#", "JOB#"), ("ConditionCheck", "Update")
GIVE_UP_WAITING = ("JOB#", "COUNTER#", "LOCK#")
# The same items as MarkWaitingForProject: armed only where no job waits for the project.
RELEASE_LOCK_AND_MARK_SUCCEEDED = ("JOB#", "LOCK#")


def _entered(stack, job_id, state: str) -> int:
    return sum(
        1 for e in history(stack, job_id) if e.get("stateEnteredEventDetails", {}).get("name") == state
    )


def _conflicts_seen(stack, job_id) -> list[str]:
    """The causes of the execution's TransactionCanceledException failures, as Step Functions gave them."""
    return [
        e["taskFailedEventDetails"]["cause"]
        for e in history(stack, job_id)
        if e["type"] == "TaskFailed"
        and e["taskFailedEventDetails"].get("error") == "DynamoDb.TransactionCanceledException"
    ]


def _holder_and_waiter(stack, settings, project_id) -> tuple[dict, str]:
    """One job holds the project (its stage dispatched, unanswered) and a second waits for it."""
    register_project(stack, project_id, STAGES, queue_timeout_sec=600)
    holder = enqueue_job(stack, settings, project_id)
    holder_task, _ = receive_stage(stack, holder)
    waiter = enqueue_job(stack, settings, project_id)
    wait_until(lambda: job_record(stack, waiter).get("waiting_for") == project_id, 60, f"{waiter} waits")
    return holder_task, waiter


def _start_queued(settings, envelope) -> None:
    start_execution(
        settings.queued_state_machine_arn,
        envelope,
        work_queue_url(settings.work_queue_prefix, envelope.region_affinity),
    )


def _written_queued(stack, settings, project_id):
    """A job written as intake writes one that queues (the lock held by another meanwhile, then
    let go), not started yet: its envelope."""
    project_cache.clear()
    project = get_project(stack.table_name, project_id)
    commit = secrets.token_hex(20)
    now = datetime.now(UTC)
    envelope = build_envelope(
        settings,
        project,
        Trigger(type=TriggerType.API, source="api"),
        "main",
        commit,
        project.frozen_stages(),
        f"{project_id}:{commit}:x",
        now,
    )
    hold_outside(stack, project_id)
    created = job_creation.create_job(stack.table_name, envelope, 600, settings.queue_limit, now)
    assert isinstance(created, job_creation.Created) and not created.took_lock
    release_outside(stack, project_id)
    return envelope


def _written_not_started(stack, settings, project_id, status: JobStatus) -> str:
    """A job written as intake writes a queued one, moved to `status` before its execution starts
    (as a cancel, or an earlier MarkStarted whose answer was lost, would), then started on the
    queued machine."""
    envelope = _written_queued(stack, settings, project_id)
    now = datetime.now(UTC)
    if status is JobStatus.CANCELED:
        job_status.mark_canceled(
            stack.table_name, envelope.job_id, JobStatus.QUEUED, "test", settings.queue_limit, now
        )
    else:
        # What an applied start leaves: the lock held by the job's execution, the job running, its slot
        # given back.
        client("dynamodb").transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": stack.table_name,
                        "Key": {"pk": {"S": f"LOCK#{project_id}"}, "sk": {"S": "LOCK"}},
                        "UpdateExpression": "SET #count = :one, kind = :kind ADD holders :me",
                        "ExpressionAttributeNames": {"#count": "count"},
                        "ExpressionAttributeValues": {
                            ":one": {"N": "1"},
                            ":kind": {"S": "lock"},
                            ":me": {"SS": [envelope.job_id]},
                        },
                    }
                },
                {
                    "Update": job_status._transition(
                        stack.table_name, envelope.job_id, JobStatus.QUEUED, status, "test", now
                    )
                },
                queue_counter.queue_counter_update(stack.table_name, settings.queue_limit, -1),
            ]
        )
    _start_queued(settings, envelope)
    return envelope.job_id


def test_a_conflict_at_the_start_is_retried_and_the_queue_slot_given_back_once(
    local_stack, intake_settings, project_id
):
    """A job that queued at intake (the lock was held then) and finds it free at its start."""
    register_project(local_stack, project_id, STAGES)
    slots = QueueSlots(local_stack, project_id)
    envelope = _written_queued(local_stack, intake_settings, project_id)
    job_id = envelope.job_id

    with dynamodb_faults.transaction_conflicts(2, ACQUIRE_PROJECT_LOCK_AND_START) as conflicts:
        _start_queued(intake_settings, envelope)
        task, _ = receive_stage(local_stack, job_id)

    assert len(conflicts.failed) == 2, "the state did not retry the conflict"
    record = job_record(local_stack, job_id)
    assert record["status"] == "running" and "start_pending" not in record
    assert slots.change() == 0  # taken at the enqueue, given back once at the start
    assert lock_record(local_stack, project_id)["holders"] == {job_id}
    assert [cause.split(" (")[0] for cause in _conflicts_seen(local_stack, job_id)] == [
        "Transaction cancelled, please refer cancellation reasons for specific reasons "
        "[TransactionConflict, None, None]"
    ] * 2
    assert _entered(local_stack, job_id, "CheckLockHolder") == 0  # a conflict is not a refusal
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    assert slots.change() == 0


def test_a_conflict_at_the_jobs_end_is_retried_in_place_and_the_lock_given_back(
    local_stack, intake_settings, project_id
):
    """Nobody waits: the job succeeds and gives the lock back in one transaction, retried on a conflict."""
    register_project(local_stack, project_id, STAGES)
    job_id = enqueue_job(local_stack, intake_settings, project_id)
    task, _ = receive_stage(local_stack, job_id)

    with dynamodb_faults.transaction_conflicts(2, RELEASE_LOCK_AND_MARK_SUCCEEDED) as conflicts:
        agent_runs(local_stack, task)
        assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

    assert len(conflicts.failed) == 2, "the state did not retry the conflict"
    assert _entered(local_stack, job_id, "ReleaseLockAndMarkSucceeded") == 3
    assert _entered(local_stack, job_id, "ReleaseProjectLock") == 0  # a conflict is not a refusal
    record = job_record(local_stack, job_id)
    assert (record["status"], record["last_successful_stage"]) == ("succeeded", STAGES[-1]["name"])
    assert "holders" not in lock_record(local_stack, project_id)


def test_a_conflict_at_mark_started_is_retried_and_the_queue_slot_given_back_once(
    local_stack, intake_settings, project_id
):
    """MarkStarted runs for a job that took the lock as the head of the line."""
    holder_task, waiter = _holder_and_waiter(local_stack, intake_settings, project_id)
    slots = QueueSlots(local_stack, project_id)

    with dynamodb_faults.transaction_conflicts(2, MARK_STARTED) as conflicts:
        agent_runs(local_stack, holder_task)
        task, _ = receive_stage(local_stack, waiter, timeout=60)

    assert len(conflicts.failed) == 2, "the state did not retry the conflict"
    record = job_record(local_stack, waiter)
    assert record["status"] == "running" and "start_pending" not in record
    assert slots.change() == -1  # the waiter's slot, given back once
    assert _entered(local_stack, waiter, "MarkStarted") == 3
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, waiter)["status"] == "SUCCEEDED"
    assert slots.change() == 0


def test_a_conflict_at_mark_waiting_for_project_is_retried_and_the_job_joins_the_line(
    local_stack, intake_settings, project_id
):
    register_project(local_stack, project_id, STAGES, queue_timeout_sec=600)
    holder = enqueue_job(local_stack, intake_settings, project_id)
    holder_task, _ = receive_stage(local_stack, holder)
    slots = QueueSlots(local_stack, project_id)

    with dynamodb_faults.transaction_conflicts(2, MARK_WAITING_FOR_PROJECT) as conflicts:
        waiter = enqueue_job(local_stack, intake_settings, project_id)
        wait_until(
            lambda: job_record(local_stack, waiter).get("waiting_for") == project_id,
            60,
            f"{waiter} joins the line",
        )

    assert len(conflicts.failed) == 2
    record = job_record(local_stack, waiter)
    assert (record["status"], record["queue_reason"]) == ("queued", "project_running")
    assert waiter in lock_record(local_stack, project_id)["waiters"]
    assert (
        client("stepfunctions").describe_execution(executionArn=job_execution_arn(local_stack, waiter))[
            "status"
        ]
        == "RUNNING"
    )
    assert slots.change() == 1  # the waiter still holds its slot
    agent_runs(local_stack, holder_task)
    task, _ = receive_stage(local_stack, waiter, timeout=60)
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, waiter)["status"] == "SUCCEEDED"
    assert slots.change() == -1


def test_a_conflict_at_acquire_as_queue_head_is_retried_in_place(local_stack, intake_settings, project_id):
    holder_task, waiter = _holder_and_waiter(local_stack, intake_settings, project_id)
    slots = QueueSlots(local_stack, project_id)
    refusals_before = _entered(local_stack, waiter, "CheckLockHolder")

    with dynamodb_faults.transaction_conflicts(2, ACQUIRE_AS_QUEUE_HEAD) as conflicts:
        agent_runs(local_stack, holder_task)
        task, _ = receive_stage(local_stack, waiter, timeout=60)

    assert len(conflicts.failed) == 2
    # A conflict is not a refusal: the head took the lock without reading it again as refused.
    assert _entered(local_stack, waiter, "CheckLockHolder") == refusals_before
    record = job_record(local_stack, waiter)
    assert record["status"] == "running" and "waiting_for" not in record
    assert slots.change() == -1
    assert lock_record(local_stack, project_id)["holders"] == {waiter}
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, waiter)["status"] == "SUCCEEDED"


def test_a_conflict_at_record_resolved_succeeded_is_retried(local_stack, project_id):
    job_id = _to_manual_review(local_stack, project_id)

    with dynamodb_faults.transaction_conflicts(2, RECORD_RESOLVED_SUCCEEDED) as conflicts:
        RelevoApi.for_stack(local_stack).resolve_stage(job_id, "upload", "succeeded", "checked by hand")
        task, _ = receive_stage(local_stack, job_id)

    assert len(conflicts.failed) == 2
    assert task["stage"] == "notify"
    assert _stage(local_stack, job_id)["status"] == "succeeded"
    assert job_record(local_stack, job_id)["last_successful_stage"] == "upload"
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"


def test_a_conflict_while_parking_is_retried_and_the_job_stays_in_line(
    local_stack, intake_settings, project_id
):
    register_project(local_stack, project_id, STAGES, queue_timeout_sec=200)
    hold_outside(local_stack, project_id)
    waiter = enqueue_job(local_stack, intake_settings, project_id)
    wait_until(lambda: job_record(local_stack, waiter).get("wake_token"), 60, f"{waiter} parked")

    with dynamodb_faults.transaction_conflicts(2, WAIT_FOR_PROJECT, operations=PARK) as conflicts:
        wait_until(lambda: len(conflicts.failed) == 2, 60, "two parks conflicting")
        parks = _entered(local_stack, waiter, "WaitForProject")
        wait_until(lambda: _entered(local_stack, waiter, "WaitForProject") > parks, 60, "parked again")

    record = job_record(local_stack, waiter)
    assert (record["status"], record["waiting_for"]) == ("queued", project_id)
    assert _entered(local_stack, waiter, "NoLongerQueued") == 0
    assert (
        client("stepfunctions").describe_execution(executionArn=job_execution_arn(local_stack, waiter))[
            "status"
        ]
        == "RUNNING"
    )
    release_outside(local_stack, project_id)
    task, _ = receive_stage(local_stack, waiter, timeout=30)
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, waiter)["status"] == "SUCCEEDED"


def test_a_conflict_while_giving_up_is_retried_and_the_queue_slot_given_back_once(
    local_stack, intake_settings, project_id
):
    register_project(local_stack, project_id, STAGES, queue_timeout_sec=5)
    hold_outside(local_stack, project_id)
    slots = QueueSlots(local_stack, project_id)

    with dynamodb_faults.transaction_conflicts(2, GIVE_UP_WAITING) as conflicts:
        waiter = enqueue_job(local_stack, intake_settings, project_id)
        described = wait_for_execution(local_stack, waiter, timeout=90)

    assert len(conflicts.failed) == 2
    assert (described["status"], described.get("error")) == ("FAILED", "Relevo.Timeout.Queue")
    assert job_record(local_stack, waiter)["status"] == "failed"
    assert waiter not in lock_record(local_stack, project_id).get("waiters", set())
    assert slots.change() == 0
    release_outside(local_stack, project_id)


def test_a_release_that_meets_a_transaction_on_the_lock_is_retried(local_stack, intake_settings, project_id):
    """ReleaseProjectLock is a single-item write on the lock item, which waiters' parks name in
    their transactions: it can fail with TransactionConflictException, and is retried."""
    register_project(local_stack, project_id, STAGES)
    job_id = enqueue_job(local_stack, intake_settings, project_id)
    task, _ = receive_stage(local_stack, job_id)

    with dynamodb_faults.write_conflicts(2, "LOCK#") as conflicts:
        agent_runs(local_stack, task)
        described = wait_for_execution(local_stack, job_id)

    assert len(conflicts.failed) == 2
    assert described["status"] == "SUCCEEDED"
    lock = lock_record(local_stack, project_id)
    assert lock["count"] == 0 and "holders" not in lock


def test_a_job_canceled_before_it_joins_the_line_still_ends_not_queued(
    local_stack, intake_settings, project_id
):
    """A real condition failure of MarkWaitingForProject (the job is no longer queued) still ends
    the execution as Relevo.Job.NotQueued, and the job never joins the line."""
    register_project(local_stack, project_id, STAGES, queue_timeout_sec=600)
    holder = enqueue_job(local_stack, intake_settings, project_id)
    holder_task, _ = receive_stage(local_stack, holder)
    slots = QueueSlots(local_stack, project_id)

    job_id = _written_not_started(local_stack, intake_settings, project_id, JobStatus.CANCELED)

    described = wait_for_execution(local_stack, job_id, timeout=30)
    assert (described["status"], described.get("error")) == ("FAILED", "Relevo.Job.NotQueued")
    assert job_id not in lock_record(local_stack, project_id).get("waiters", set())
    assert slots.change() == 0
    agent_runs(local_stack, holder_task)


def test_a_job_already_started_runs_its_stages_without_giving_back_a_second_slot(
    local_stack, intake_settings, project_id
):
    """A real condition failure of MarkStarted (the job is running already: an earlier start was
    applied, its answer lost, and the execution holds the lock) still goes on to the stages, and
    the slot is not given back twice."""
    register_project(local_stack, project_id, STAGES)
    slots = QueueSlots(local_stack, project_id)

    job_id = _written_not_started(local_stack, intake_settings, project_id, JobStatus.RUNNING)

    task, _ = receive_stage(local_stack, job_id)
    assert slots.change() == 0
    assert job_record(local_stack, job_id)["status"] == "running"
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    assert slots.change() == 0


def test_the_switch_fails_a_transaction_the_way_dynamodb_does(local_stack):
    """Through moto's response path: HTTP 400, TransactionCanceledException, one reason per item."""
    table = local_stack.table_name
    # MarkStarted's key prefixes (JOB#, COUNTER#), the switch matches on them, but sort keys of no
    # record Relevo reads: a JOB#…/JOB item without its fields would break every later listing
    # and sweep of the worker's stack.
    probe = uuid.uuid4().hex
    items = [
        {
            "Update": {
                "TableName": table,
                "Key": {"pk": {"S": f"JOB#probe-{probe}"}, "sk": {"S": "PROBE"}},
                "UpdateExpression": "SET a = :a",
                "ExpressionAttributeValues": {":a": {"S": "1"}},
            }
        },
        {
            "Update": {
                "TableName": table,
                "Key": {"pk": {"S": f"COUNTER#probe-{probe}"}, "sk": {"S": "PROBE"}},
                "UpdateExpression": "SET a = :a",
                "ExpressionAttributeValues": {":a": {"S": "1"}},
            }
        },
    ]
    with dynamodb_faults.transaction_conflicts(1, MARK_STARTED, conflict_on=1) as conflicts:
        try:
            client("dynamodb").transact_write_items(TransactItems=items)
            raise AssertionError("the switch did not fail the transaction")
        except client("dynamodb").exceptions.TransactionCanceledException as exc:
            response = exc.response
        client("dynamodb").transact_write_items(TransactItems=items)  # only the next one

    assert conflicts.remaining == 0 and conflicts.failed == [MARK_STARTED]
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert response["Error"]["Message"].endswith("[None, TransactionConflict]")
    assert [reason["Code"] for reason in response["CancellationReasons"]] == ["None", "TransactionConflict"]
    assert table_items(local_stack, f"JOB#probe-{probe}"), (
        "the transaction after the injected one was not applied"
    )
