"""Access pattern: a job's creation, in one transaction with its dedup record, its delivery record
and its queue slot: all of it written, or none of it."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_core.models.envelope import JobEnvelope
from relevo_core.models.status import HeldReason, JobStatus
from relevo_core.store.codec import PACKED_ENVELOPE, pack_envelope, to_attributes
from relevo_core.store.conditional import transaction_cancellation
from relevo_core.store.freezes import not_frozen_check
from relevo_core.store.keys import (
    BUILD_NUMBER_ATTRIBUTE,
    DEDUP_SK,
    DELIVERY_SK,
    HELD_REASON_ATTRIBUTE,
    JOB_SK,
    MACHINE_ATTRIBUTE,
    PROJECT_JOBS_ATTRIBUTE,
    RUN_MACHINE,
    START_PENDING,
    START_PENDING_ATTRIBUTE,
    WAIT_ORDER_ATTRIBUTE,
    dedup_pk,
    delivery_pk,
    job_pk,
    queue_seq,
    wait_order,
)
from relevo_core.store.locks import acquire_if_free
from relevo_core.store.queue_counter import queue_counter_update

if TYPE_CHECKING:
    from relevo_core.models.project_settings import OnRepeat

# A dedup record outlives its window by this much, so a repeat after the window is still
# recognised as a repeat (and follows on_repeat) rather than mistaken for a first arrival.
DEDUP_MEMORY_SEC = 30 * 24 * 3600
DELIVERY_MEMORY_SEC = 7 * 24 * 3600
_CONFLICT_RETRIES = 6


@dataclass(frozen=True)
class Created:
    job_id: str
    # Why it was written held (None: queued or running); create_job_or_repeat's repeat after the
    # window may hold a job its caller did not.
    held_reason: HeldReason | None = None
    # The job took its project's lock in its own transaction: written running, its execution
    # starts at its stages (keys.RUN_MACHINE); otherwise it waits in the queue for the lock.
    took_lock: bool = False
    # The lock's condition refused the job in this call: it was taken or waited for just now.
    found_lock_taken: bool = False


@dataclass(frozen=True)
class Duplicate:
    job_id: str
    # "idempotency_key": same work inside its window; "delivery": the same delivery replayed.
    matched: str


@dataclass(frozen=True)
class RepeatAfterWindow:
    previous_job_id: str
    previous_expires_at: int


@dataclass(frozen=True)
class QueueFull:
    queued: int
    limit: int


@dataclass(frozen=True)
class KeyFrozen:
    idempotency_key: str


CreateOutcome = Created | Duplicate | RepeatAfterWindow | QueueFull | KeyFrozen


def job_item(
    envelope: JobEnvelope,
    status: JobStatus,
    now: datetime,
    held_reason: HeldReason | None = None,
    build_number: int | None = None,
) -> dict[str, Any]:
    """A new job's record: the frozen envelope (packed: store/codec) plus its status projection (a
    held job's record says why it is held). A job from a later stage starts with its envelope's
    `stands_on` as its last successful stage; a rerun or redrive with the `build_number` of the job
    it retries.

    `queue_seq` and `wait_order` place the job among the jobs waiting for its project; the order
    key only becomes visible in WaitOrderIndex once the state machine marks the job waiting.
    """
    seq = queue_seq(envelope.created_at)
    item: dict[str, Any] = {
        "pk": job_pk(envelope.job_id),
        "sk": JOB_SK,
        PACKED_ENVELOPE: pack_envelope(envelope.to_json_dict()),
        "schema_version": envelope.schema_version,
        "job_id": envelope.job_id,
        "project": envelope.project,
        PROJECT_JOBS_ATTRIBUTE: envelope.project,
        "status": status.value,
        "priority": envelope.priority,
        "queue_seq": seq,
        WAIT_ORDER_ATTRIBUTE: wait_order(envelope.priority, seq, envelope.job_id),
        "created_at": envelope.created_at.isoformat(),
        "updated_at": now.isoformat(),
        "last_writer": "intake",
        "ttl": envelope.ttl,
    }
    if envelope.first_stage_index > 0 and envelope.stands_on is not None:
        item["last_successful_stage"] = envelope.stands_on
    if held_reason is not None:
        item[HELD_REASON_ATTRIBUTE] = held_reason.value
    if build_number is not None:
        item[BUILD_NUMBER_ATTRIBUTE] = build_number
    if status is JobStatus.RUNNING:
        # It took its project's lock with its creation: its execution runs from its stages. The
        # sweeper finds it through the lock should its execution never start (sweeper.
        # free_locks_of_ended_executions), so it needs no marker, and no write to clear one.
        item[MACHINE_ATTRIBUTE] = RUN_MACHINE
    if status is JobStatus.QUEUED:
        # Sparse index entry: present until the execution's first state removes it, so the
        # sweeper can find a job whose execution never started.
        item[START_PENDING_ATTRIBUTE] = START_PENDING
    return item


def create_job(
    table: str,
    envelope: JobEnvelope,
    dedup_window_sec: int,
    queue_limit: int,
    now: datetime,
    held_reason: HeldReason | None = None,
    replaces_expires_at: int | None = None,
    refuse_frozen: bool = False,
    also_write: Sequence[dict[str, Any]] = (),
    build_number: int | None = None,
    queue_first: bool = False,
) -> CreateOutcome:
    """Write the job in one transaction: dedup record, delivery record, envelope and queue slot.

    Either all of it is written or none of it. A live dedup record or a known delivery id makes
    the transaction fail, and DynamoDB returns the existing record with the failure
    (ReturnValuesOnConditionCheckFailure), so a duplicate costs this one call. A held job (one
    kept for an operator, `held_reason` saying why) takes no queue slot and starts no execution.
    `replaces_expires_at` takes over an expired dedup record, only if nobody else did first.
    `refuse_frozen` adds a check, inside the same transaction, that the key is not frozen.
    `also_write`: unconditional Puts written with the job and only with it (the record of the
    webhook delivery that asked for it), after the items above, whose positions the cancellation
    reasons are read by.

    Five actions of its own and `also_write` (intake's: one), the job's item within the envelope's
    MAX_ENVELOPE_BYTES (plan_limits) and the others a few hundred bytes: TransactWriteItems takes
    up to 100 actions, no two on one item, 4 MB in all ("TransactWriteItems", DynamoDB API
    Reference; tests/unit/test_job_transaction.py). botocore fills in the call's
    ClientRequestToken (an idempotency token in DynamoDB's service model), so its own retry of a
    call whose answer was lost is answered as the first call was, with no second write (for 10
    minutes, same reference); a repeat without it finds our own job id in the refused dedup or
    delivery record, read below as Created.

    A job that is not held first tries to take its project's lock in the same transaction
    (locks.acquire_if_free: only while the lock has room and nobody waits), written running with
    no queue slot: Created.took_lock. The lock's refusal alone writes it queued instead, taking a
    slot, in a second transaction; a refusal for any other reason is read as it always was.
    `queue_first` (the caller found the lock taken a moment ago: intake.busy_projects) writes it
    queued in the first transaction, sparing the one the lock would refuse; the queued machine
    takes the lock itself should it be free after all.
    """
    epoch = int(now.timestamp())
    dedup_until = epoch + dedup_window_sec
    if replaces_expires_at is None:
        dedup_condition = "attribute_not_exists(pk)"
        dedup_values: dict[str, Any] = {}
    else:
        dedup_condition = "expires_at = :previous"
        dedup_values = {":previous": {"N": str(replaces_expires_at)}}
    items: list[dict[str, Any]] = [
        {
            "Put": {
                "TableName": table,
                "Item": to_attributes(
                    {
                        "pk": dedup_pk(envelope.idempotency_key),
                        "sk": DEDUP_SK,
                        "job_id": envelope.job_id,
                        "expires_at": dedup_until,
                        "ttl": dedup_until + DEDUP_MEMORY_SEC,
                    }
                ),
                "ConditionExpression": dedup_condition,
                **({"ExpressionAttributeValues": dedup_values} if dedup_values else {}),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
    ]
    delivery_index = None
    if envelope.trigger.delivery_id:
        delivery_index = len(items)
        items.append(
            {
                "Put": {
                    "TableName": table,
                    "Item": to_attributes(
                        {
                            "pk": delivery_pk(envelope.trigger.source, envelope.trigger.delivery_id),
                            "sk": DELIVERY_SK,
                            "job_id": envelope.job_id,
                            "ttl": epoch + DELIVERY_MEMORY_SEC,
                        }
                    ),
                    "ConditionExpression": "attribute_not_exists(pk)",
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }
        )
    held = held_reason is not None

    def job_put(status: JobStatus) -> dict[str, Any]:
        record = job_item(envelope, status, now, held_reason, build_number)
        return {
            "Put": {
                "TableName": table,
                "Item": to_attributes(record),
                "ConditionExpression": "attribute_not_exists(pk)",
            }
        }

    job_index = len(items)
    # The slot the job takes: its project's lock (it runs at once), else a place in the queue.
    lock_index = counter_index = None
    if held:
        items.append(job_put(JobStatus.HELD))
    elif queue_first:
        items.append(job_put(JobStatus.QUEUED))
        counter_index = len(items)
        items.append(queue_counter_update(table, queue_limit, +1))
    else:
        items.append(job_put(JobStatus.RUNNING))
        lock_index = len(items)
        items.append(acquire_if_free(table, envelope.project, envelope.job_id))
    frozen_index = None
    if refuse_frozen and not held:
        frozen_index = len(items)
        items.append(not_frozen_check(table, envelope.idempotency_key))
    items.extend(also_write)

    found_lock_taken = False
    for attempt in range(_CONFLICT_RETRIES):
        try:
            client("dynamodb").transact_write_items(TransactItems=items)
            return Created(
                envelope.job_id, took_lock=lock_index is not None, found_lock_taken=found_lock_taken
            )
        except ClientError as exc:
            cancellation = transaction_cancellation(exc)
            if cancellation is None:
                raise
        if delivery_index is not None and cancellation.condition_failed(delivery_index):
            existing_job = str(cancellation.item(delivery_index)["job_id"])
            if existing_job == envelope.job_id:
                # Our own write, retried by the SDK after a lost response: it did succeed.
                return _ours(table, envelope.job_id)
            return Duplicate(existing_job, "delivery")
        if cancellation.condition_failed(0):
            existing = cancellation.item(0)
            if not existing:
                # The expired record we meant to take over is gone (TTL): a first arrival now.
                items[0]["Put"]["ConditionExpression"] = "attribute_not_exists(pk)"
                items[0]["Put"].pop("ExpressionAttributeValues", None)
                continue
            if existing["job_id"] == envelope.job_id:
                return _ours(table, envelope.job_id)  # our own write, retried after a lost response
            if int(existing["expires_at"]) >= epoch:
                return Duplicate(str(existing["job_id"]), "idempotency_key")
            return RepeatAfterWindow(str(existing["job_id"]), int(existing["expires_at"]))
        if frozen_index is not None and cancellation.condition_failed(frozen_index):
            return KeyFrozen(envelope.idempotency_key)
        if lock_index is not None and cancellation.condition_failed(lock_index):
            # The project's lock is taken or waited for: the job queues for it instead.
            items[job_index] = job_put(JobStatus.QUEUED)
            items[lock_index] = queue_counter_update(table, queue_limit, +1)
            lock_index, counter_index = None, lock_index
            found_lock_taken = True
            continue
        if counter_index is not None and cancellation.condition_failed(counter_index):
            if queue_first:
                # The queue is full and the lock was only remembered taken: a job that takes a
                # free lock needs no slot, so the lock is tried before the job is refused.
                queue_first = False
                items[job_index] = job_put(JobStatus.RUNNING)
                items[counter_index] = acquire_if_free(table, envelope.project, envelope.job_id)
                lock_index, counter_index = counter_index, None
                continue
            queued = cancellation.item(counter_index).get("queued", queue_limit)
            return QueueFull(int(queued), queue_limit)
        if "TransactionConflict" in cancellation.codes:
            # Another intake touched the same counter or key at the same instant: try again.
            time.sleep(random.uniform(0, 0.05 * 2**attempt))
            continue
        raise RuntimeError(f"job transaction cancelled: {cancellation.codes}")
    raise RuntimeError("job transaction kept conflicting")


def _ours(table: str, job_id: str) -> Created:
    """Our own job, written by an earlier send of this transaction whose answer was lost: whether
    it took the lock is on its record (a strongly consistent read)."""
    item = (
        client("dynamodb")
        .get_item(
            TableName=table,
            Key=to_attributes({"pk": job_pk(job_id), "sk": JOB_SK}),
            ProjectionExpression=MACHINE_ATTRIBUTE,
            ConsistentRead=True,
        )
        .get("Item", {})
    )
    return Created(job_id, took_lock=item.get(MACHINE_ATTRIBUTE, {}).get("S") == RUN_MACHINE)


def create_job_or_repeat(
    table: str,
    envelope: JobEnvelope,
    dedup_window_sec: int,
    queue_limit: int,
    now: datetime,
    on_repeat: OnRepeat,
    held_reason: HeldReason | None = None,
    refuse_frozen: bool = False,
    also_write: Callable[[HeldReason | None], Sequence[dict[str, Any]]] = lambda _held: (),
    build_number: int | None = None,
    queue_first: bool = False,
) -> CreateOutcome:
    """create_job, and for a repeat of work whose dedup window has passed, what the project's
    `on_repeat` says: skip (RepeatAfterWindow is the answer), hold (written held,
    repeat_after_window) or run; a held or run repeat takes the expired dedup record over in a
    second transaction, and a RepeatAfterWindow from that one means a concurrent repeat took it
    first. `also_write(held_reason)`: the Puts written with the job, for the reason it is held;
    `build_number`: the number of the job it retries, on its record from the start; `queue_first`:
    create_job's."""
    # The caller has it loaded; this module's other users need not.
    from relevo_core.models.project_settings import OnRepeat

    outcome = create_job(
        table,
        envelope,
        dedup_window_sec,
        queue_limit,
        now,
        held_reason=held_reason,
        refuse_frozen=refuse_frozen,
        also_write=also_write(held_reason),
        build_number=build_number,
        queue_first=queue_first,
    )
    if not isinstance(outcome, RepeatAfterWindow) or on_repeat is OnRepeat.SKIP:
        return replace(outcome, held_reason=held_reason) if isinstance(outcome, Created) else outcome
    if held_reason is None and on_repeat is OnRepeat.HOLD:
        held_reason = HeldReason.REPEAT_AFTER_WINDOW
    outcome = create_job(
        table,
        envelope,
        dedup_window_sec,
        queue_limit,
        now,
        held_reason=held_reason,
        replaces_expires_at=outcome.previous_expires_at,
        refuse_frozen=refuse_frozen,
        also_write=also_write(held_reason),
        build_number=build_number,
        queue_first=queue_first,
    )
    return replace(outcome, held_reason=held_reason) if isinstance(outcome, Created) else outcome
