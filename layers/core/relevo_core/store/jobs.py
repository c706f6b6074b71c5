"""Access pattern: a job's envelope and its status projection, written once and read whole."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code, in_this_context, side_by_side
from relevo_core.models.envelope import JobEnvelope, read_envelope
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import HeldReason, JobStatus
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.conditional import transaction_cancellation
from relevo_core.store.freezes import not_frozen_check
from relevo_core.store.keys import (
    COUNTER_SK,
    DEDUP_SK,
    DELIVERY_SK,
    DLQ_SK,
    JOB_SK,
    PROJECT_JOBS_ATTRIBUTE,
    QUEUE_COUNTER_PK,
    START_PENDING,
    START_PENDING_ATTRIBUTE,
    START_PENDING_INDEX,
    WAIT_ORDER_ATTRIBUTE,
    WAITING_FOR_ATTRIBUTE,
    WAKE_TOKEN_ATTRIBUTE,
    dedup_pk,
    delivery_pk,
    dlq_pk,
    job_pk,
    key,
    queue_seq,
    stages_pk,
    wait_order,
)
from relevo_core.store.paging import query_items

if TYPE_CHECKING:
    from relevo_core.models.project import OnRepeat


# A dedup record outlives its window by this much, so a repeat after the window is still
# recognised as a repeat (and follows on_repeat) rather than mistaken for a first arrival.
DEDUP_MEMORY_SEC = 30 * 24 * 3600
DELIVERY_MEMORY_SEC = 7 * 24 * 3600
_CONFLICT_RETRIES = 6
# Why a held job is held (a HeldReason value); present only while the job is held.
HELD_REASON_ATTRIBUTE = "held_reason"


@dataclass(frozen=True)
class Created:
    job_id: str
    # Why it was written held (None: queued); create_job_or_repeat's repeat after the window may
    # hold a job its caller did not.
    held_reason: HeldReason | None = None


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


def queue_counter_update(table: str, limit: int, delta: int) -> dict[str, Any]:
    update: dict[str, Any] = {
        "TableName": table,
        "Key": key(QUEUE_COUNTER_PK, COUNTER_SK),
        "UpdateExpression": "SET queued = if_not_exists(queued, :zero) + :delta",
        "ExpressionAttributeValues": {":zero": {"N": "0"}, ":delta": {"N": str(delta)}},
    }
    if delta > 0:
        update["ConditionExpression"] = "attribute_not_exists(queued) OR queued < :limit"
        update["ExpressionAttributeValues"][":limit"] = {"N": str(limit)}
        update["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    return {"Update": update}


def job_item(
    envelope: JobEnvelope,
    status: JobStatus,
    now: datetime,
    held_reason: HeldReason | None = None,
) -> dict[str, Any]:
    """A new job's record: the frozen envelope plus its status projection (a held job's record
    says why it is held). A job from a later stage starts with its envelope's `stands_on` as its
    last successful stage.

    `queue_seq` and `wait_order` place the job among the jobs waiting for its project; the order
    key only becomes visible in WaitOrderIndex once the state machine marks the job waiting.
    """
    seq = queue_seq(envelope.created_at)
    item: dict[str, Any] = {
        "pk": job_pk(envelope.job_id),
        "sk": JOB_SK,
        "envelope": envelope.to_json_dict(),
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
    record = job_item(envelope, JobStatus.HELD if held else JobStatus.QUEUED, now, held_reason)
    items.append(
        {
            "Put": {
                "TableName": table,
                "Item": to_attributes(record),
                "ConditionExpression": "attribute_not_exists(pk)",
            }
        }
    )
    counter_index = None
    if not held:
        counter_index = len(items)
        items.append(queue_counter_update(table, queue_limit, +1))
    frozen_index = None
    if refuse_frozen and not held:
        frozen_index = len(items)
        items.append(not_frozen_check(table, envelope.idempotency_key))
    items.extend(also_write)

    for attempt in range(_CONFLICT_RETRIES):
        try:
            client("dynamodb").transact_write_items(TransactItems=items)
            return Created(envelope.job_id)
        except ClientError as exc:
            cancellation = transaction_cancellation(exc)
            if cancellation is None:
                raise
        if delivery_index is not None and cancellation.condition_failed(delivery_index):
            existing_job = str(cancellation.item(delivery_index)["job_id"])
            if existing_job == envelope.job_id:
                # Our own write, retried by the SDK after a lost response: it did succeed.
                return Created(envelope.job_id)
            return Duplicate(existing_job, "delivery")
        if cancellation.condition_failed(0):
            existing = cancellation.item(0)
            if not existing:
                # The expired record we meant to take over is gone (TTL): a first arrival now.
                items[0]["Put"]["ConditionExpression"] = "attribute_not_exists(pk)"
                items[0]["Put"].pop("ExpressionAttributeValues", None)
                continue
            if existing["job_id"] == envelope.job_id:
                return Created(envelope.job_id)  # our own write, retried after a lost response
            if int(existing["expires_at"]) >= epoch:
                return Duplicate(str(existing["job_id"]), "idempotency_key")
            return RepeatAfterWindow(str(existing["job_id"]), int(existing["expires_at"]))
        if frozen_index is not None and cancellation.condition_failed(frozen_index):
            return KeyFrozen(envelope.idempotency_key)
        if counter_index is not None and cancellation.condition_failed(counter_index):
            queued = cancellation.item(counter_index).get("queued", queue_limit)
            return QueueFull(int(queued), queue_limit)
        if "TransactionConflict" in cancellation.codes:
            # Another intake touched the same counter or key at the same instant: try again.
            time.sleep(random.uniform(0, 0.05 * 2**attempt))
            continue
        raise RuntimeError(f"job transaction cancelled: {cancellation.codes}")
    raise RuntimeError("job transaction kept conflicting")


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
) -> CreateOutcome:
    """create_job, and for a repeat of work whose dedup window has passed, what the project's
    `on_repeat` says: skip (RepeatAfterWindow is the answer), hold (written held,
    repeat_after_window) or run; a held or run repeat takes the expired dedup record over in a
    second transaction, and a RepeatAfterWindow from that one means a concurrent repeat took it
    first. `also_write(held_reason)`: the Puts written with the job, for the reason it is held."""
    from relevo_core.models.project import (
        OnRepeat,
    )  # the caller has it loaded; this module's other users need not

    outcome = create_job(
        table,
        envelope,
        dedup_window_sec,
        queue_limit,
        now,
        held_reason=held_reason,
        refuse_frozen=refuse_frozen,
        also_write=also_write(held_reason),
    )
    if not isinstance(outcome, RepeatAfterWindow) or on_repeat is OnRepeat.SKIP:
        return Created(outcome.job_id, held_reason) if isinstance(outcome, Created) else outcome
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
    )
    return Created(outcome.job_id, held_reason) if isinstance(outcome, Created) else outcome


def get_job_record(table: str, job_id: str) -> dict[str, Any]:
    response = client("dynamodb").get_item(
        TableName=table, Key=key(job_pk(job_id), JOB_SK), ConsistentRead=True
    )
    if "Item" not in response:
        raise RelevoError(ErrorCode.JOB_NOT_FOUND, f"no job {job_id!r}")
    return from_attributes(response["Item"])


def job_project(table: str, job_id: str, dead_letter: bool = False) -> str | None:
    """The project a job belongs to, or None when there is no such job. With `dead_letter`, the
    project of the job's dead-letter entry, which outlives a deleted job."""
    response = client("dynamodb").get_item(
        TableName=table,
        Key=key(dlq_pk(job_id), DLQ_SK) if dead_letter else key(job_pk(job_id), JOB_SK),
        ProjectionExpression="#project",
        ExpressionAttributeNames={"#project": "project"},
        ConsistentRead=True,
    )
    item = response.get("Item")
    return str(from_attributes(item)["project"]) if item else None


def _transition(
    table: str,
    job_id: str,
    previous: JobStatus,
    next_status: JobStatus,
    writer: str,
    now: datetime,
    extra: str = "",
    values: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A status change of a job record by `writer`, conditional on the status it was read in."""
    return {
        "TableName": table,
        "Key": key(job_pk(job_id), JOB_SK),
        "UpdateExpression": "SET #status = :next, last_writer = :writer, updated_at = :now" + extra,
        "ConditionExpression": "#status = :previous",
        "ExpressionAttributeNames": {"#status": "status"},
        "ExpressionAttributeValues": to_attributes(
            {
                ":next": next_status.value,
                ":previous": previous.value,
                ":writer": writer,
                ":now": now.isoformat(),
                **(values or {}),
            }
        ),
    }


def _end_job(
    table: str,
    job_id: str,
    previous: JobStatus,
    final: JobStatus,
    writer: str,
    queue_limit: int,
    now: datetime,
    extra: str = "",
    values: dict[str, Any] | None = None,
) -> None:
    """The job ends `final`, in one transaction with giving back its queue slot if it held one
    (it was queued). The job update is conditional on the status read, like the state machine's
    MarkStarted, so a slot is given back once however often this races or repeats; a refused
    condition raises StatusChanged and the caller reads again."""
    update = _transition(
        table,
        job_id,
        previous,
        final,
        writer,
        now,
        extra=f", ended_at = :now{extra} REMOVE {START_PENDING_ATTRIBUTE}, queue_reason, {WAITING_FOR_ATTRIBUTE}, {WAKE_TOKEN_ATTRIBUTE}, {HELD_REASON_ATTRIBUTE}",
        values=values,
    )
    items: list[dict[str, Any]] = [{"Update": update}]
    if previous is JobStatus.QUEUED:
        items.append(queue_counter_update(table, queue_limit, -1))
    try:
        client("dynamodb").transact_write_items(TransactItems=items)
    except ClientError as exc:
        if error_code(exc) == "TransactionCanceledException":
            raise StatusChanged(job_id) from exc
        raise


def mark_canceled(
    table: str, job_id: str, previous: JobStatus, actor: str, queue_limit: int, now: datetime
) -> None:
    """The job becomes canceled by an operator, giving back its queue slot if it held one."""
    _end_job(table, job_id, previous, JobStatus.CANCELED, f"operator:{actor}", queue_limit, now)


# last_writer of a job whose execution ended outside Relevo (see relevo_core.recovery.sweeper).
SWEEPER_WRITER = "sweeper"


def mark_ended_outside(
    table: str,
    job_id: str,
    previous: JobStatus,
    final: JobStatus,
    queue_limit: int,
    now: datetime,
    error_name: str | None = None,
    error_cause: str | None = None,
) -> None:
    """The sweeper mirrors an execution that ended without a last state (stopped, aborted,
    timed out) onto its job, giving back the queue slot if the job was still queued."""
    extra, values = "", {}
    if error_name:
        extra, values = (
            ", error_name = :error, error_cause = :cause",
            {":error": error_name, ":cause": error_cause or ""},
        )
    _end_job(table, job_id, previous, final, SWEEPER_WRITER, queue_limit, now, extra, values)


def record_approval_decision(table: str, job_id: str, decision: dict[str, Any]) -> None:
    """Who approved or rejected the job's gate, when and why, on the job record itself, so the job
    view says it without reading the audit trail (the audit record is written beside it)."""
    client("dynamodb").update_item(
        TableName=table,
        Key=key(job_pk(job_id), JOB_SK),
        UpdateExpression="SET approval_decision = :decision",
        ConditionExpression="attribute_exists(pk)",
        ExpressionAttributeValues=to_attributes({":decision": decision}),
    )


class StatusChanged(Exception):
    """The job moved on between the read and the conditional write."""


def release_held(table: str, job_id: str, queue_limit: int, actor: str, now: datetime) -> None:
    """held -> queued, taking a queue slot and dropping the held reason, in one transaction."""
    try:
        client("dynamodb").transact_write_items(
            TransactItems=[
                {
                    "Update": _transition(
                        table,
                        job_id,
                        JobStatus.HELD,
                        JobStatus.QUEUED,
                        f"operator:{actor}",
                        now,
                        extra=f", {START_PENDING_ATTRIBUTE} = :pending REMOVE {HELD_REASON_ATTRIBUTE}",
                        values={":pending": START_PENDING},
                    )
                },
                queue_counter_update(table, queue_limit, +1),
            ]
        )
    except ClientError as exc:
        cancellation = transaction_cancellation(exc)
        if cancellation is None:
            raise
        if cancellation.condition_failed(0):
            raise RelevoError(ErrorCode.JOB_NOT_HELD, f"job {job_id} is not held") from exc
        raise RelevoError(ErrorCode.QUEUE_FULL, f"{queue_limit} jobs are already queued") from exc


def start_pending_jobs(table: str, created_before: datetime) -> list[str]:
    """Job ids whose execution has not run its first state, created before the given time."""
    job_ids: list[str] = []
    kwargs: dict[str, Any] = {
        "TableName": table,
        "IndexName": START_PENDING_INDEX,
        "KeyConditionExpression": f"{START_PENDING_ATTRIBUTE} = :pending AND created_at < :before",
        "ExpressionAttributeValues": {
            ":pending": {"S": START_PENDING},
            ":before": {"S": created_before.isoformat()},
        },
        "ProjectionExpression": "job_id",
    }
    while True:
        page = client("dynamodb").query(**kwargs)
        job_ids.extend(from_attributes(item)["job_id"] for item in page["Items"])
        if "LastEvaluatedKey" not in page:
            return job_ids
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def clear_start_pending(table: str, job_id: str) -> None:
    client("dynamodb").update_item(
        TableName=table, Key=key(job_pk(job_id), JOB_SK), UpdateExpression=f"REMOVE {START_PENDING_ATTRIBUTE}"
    )


def query_job_items(table: str, job_id: str) -> list[dict[str, Any]]:
    """A job's record and its stage records, each in key order: two partitions (store/keys
    stages_pk), read side by side. A job of a stack deployed before stages had a partition of
    their own keeps them under its JOB# partition: they are read from there too."""

    def partition(pk: str) -> list[dict[str, Any]]:
        return list(
            query_items(
                TableName=table,
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": {"S": pk}},
                ConsistentRead=True,
            )
        )

    record, stages = side_by_side().map(in_this_context(partition), (job_pk(job_id), stages_pk(job_id)))
    return record + stages


def get_envelope(table: str, job_id: str) -> JobEnvelope:
    response = client("dynamodb").get_item(
        TableName=table, Key=key(job_pk(job_id), JOB_SK), ConsistentRead=True, ProjectionExpression="envelope"
    )
    if "Item" not in response:
        raise RelevoError(ErrorCode.JOB_NOT_FOUND, f"no job {job_id!r}")
    return read_envelope(from_attributes(response["Item"])["envelope"])
