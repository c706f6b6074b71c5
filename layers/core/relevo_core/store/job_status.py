"""Access pattern: a job record's status changes after its creation (an operator's cancel or release,
the sweeper's mirror of an execution ended outside Relevo), each conditional on the status it was
read in, with the queue slot given back or taken in the same transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import JobStatus
from relevo_core.store.codec import to_attributes
from relevo_core.store.conditional import transaction_cancellation
from relevo_core.store.keys import (
    HELD_REASON_ATTRIBUTE,
    JOB_SK,
    START_PENDING,
    START_PENDING_ATTRIBUTE,
    WAITING_FOR_ATTRIBUTE,
    WAKE_TOKEN_ATTRIBUTE,
    job_pk,
    key,
)
from relevo_core.store.queue_counter import queue_counter_update


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
        extra=f", ended_at = :now{extra} REMOVE {START_PENDING_ATTRIBUTE}, queue_reason, "
        f"{WAITING_FOR_ATTRIBUTE}, {WAKE_TOKEN_ATTRIBUTE}, {HELD_REASON_ATTRIBUTE}",
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
