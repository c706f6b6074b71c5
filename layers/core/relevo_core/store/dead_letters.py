"""Access pattern: dead-letter entries (written by the state machine when a job fails for good),
listed through KindIndex, and a redrive that resumes the job under the same idempotency key."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_core.models.envelope import JobEnvelope
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import JobStatus
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.conditional import transaction_cancellation
from relevo_core.store.job_creation import job_item
from relevo_core.store.keys import DEDUP_SK, DLQ_KIND, DLQ_SK, dedup_pk, dlq_pk, key
from relevo_core.store.kinds import items_of_kind
from relevo_core.store.queue_counter import queue_counter_update


def list_entries(table: str) -> list[dict[str, Any]]:
    return sorted(items_of_kind(table, DLQ_KIND), key=lambda entry: entry.get("failed_at", ""), reverse=True)


def get_entry(table: str, job_id: str) -> dict[str, Any]:
    item = (
        client("dynamodb")
        .get_item(TableName=table, Key=key(dlq_pk(job_id), DLQ_SK), ConsistentRead=True)
        .get("Item")
    )
    if item is None:
        raise RelevoError(ErrorCode.DLQ_ENTRY_NOT_FOUND, f"job {job_id} is not in the dead-letter queue")
    return from_attributes(item)


def redrive(
    table: str,
    failed_job_id: str,
    envelope: JobEnvelope,
    queue_limit: int,
    actor: str,
    now: datetime,
    carried: list[dict[str, Any]] | None = None,
    build_number: int | None = None,
) -> None:
    """In one transaction: the entry is marked redriven (once), the new job is written with a
    queue slot, the idempotency key's dedup record moves to the new job, and the `carried`
    items (store/carried_shards: the failed stage's shards that succeeded) are written under it,
    with the failed job's `build_number` on its record.
    A transaction takes up to 100 items (DynamoDB API Reference, "TransactWriteItems"); a stage
    has at most 45 shards (relevo_core.plan_limits)."""
    try:
        client("dynamodb").transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": table,
                        "Key": key(dlq_pk(failed_job_id), DLQ_SK),
                        "UpdateExpression": "SET #state = :redriven, redriven_as = :new, redriven_by = "
                        ":actor, redriven_at = :now",
                        "ConditionExpression": "#state = :open",
                        "ExpressionAttributeNames": {"#state": "state"},
                        "ExpressionAttributeValues": to_attributes(
                            {
                                ":redriven": "redriven",
                                ":open": "open",
                                ":new": envelope.job_id,
                                ":actor": actor,
                                ":now": now.isoformat(),
                            }
                        ),
                    }
                },
                {
                    "Put": {
                        "TableName": table,
                        "Item": to_attributes(
                            job_item(envelope, JobStatus.QUEUED, now, build_number=build_number)
                        ),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                queue_counter_update(table, queue_limit, +1),
                {
                    "Update": {
                        "TableName": table,
                        "Key": key(dedup_pk(envelope.idempotency_key), DEDUP_SK),
                        "UpdateExpression": "SET job_id = :new",
                        "ExpressionAttributeValues": to_attributes({":new": envelope.job_id}),
                    }
                },
                *(carried or []),
            ]
        )
    except ClientError as exc:
        cancellation = transaction_cancellation(exc)
        if cancellation is None:
            raise
        if cancellation.condition_failed(0):
            raise RelevoError(
                ErrorCode.DLQ_ENTRY_NOT_FOUND, f"job {failed_job_id} was already redriven"
            ) from exc
        if cancellation.condition_failed(2):
            raise RelevoError(ErrorCode.QUEUE_FULL, f"{queue_limit} jobs are already queued") from exc
        raise
