"""Access pattern: the jobs waiting for one project's lock, in the order they will run.

While a job waits, the state machine sets `waiting_for` (its project) on the job record in the
same transaction that adds it to the lock's `waiters`; the record's `wait_order` (derived from
priority and queue_seq) sorts it in the sparse WaitOrderIndex. Only the first entry may take a
freed lock, and taking it removes the entry. The lock write stays conditional, so mutual
exclusion never rests on this (eventually consistent) index: it only decides who goes next.
"""

from __future__ import annotations

from datetime import datetime
from itertools import islice
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.models.status import JobStatus
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.conditional import update_if
from relevo_core.store.job_status import StatusChanged
from relevo_core.store.keys import (
    JOB_SK,
    LOCK_SK,
    WAIT_ORDER_ATTRIBUTE,
    WAIT_ORDER_INDEX,
    WAITING_FOR_ATTRIBUTE,
    WAKE_TOKEN_ATTRIBUTE,
    job_pk,
    key,
    lock_pk,
    wait_order,
)
from relevo_core.store.paging import query_items


def waiting_jobs(table: str, project_id: str, limit: int | None = None) -> list[str]:
    """Job ids waiting for the project's lock, the one that goes next first."""
    kwargs: dict[str, Any] = {
        "TableName": table,
        "IndexName": WAIT_ORDER_INDEX,
        "KeyConditionExpression": f"{WAITING_FOR_ATTRIBUTE} = :project",
        "ExpressionAttributeValues": {":project": {"S": project_id}},
        "ProjectionExpression": "job_id",
    }
    if limit:
        kwargs["Limit"] = limit
    return [str(item["job_id"]) for item in islice(query_items(**kwargs), limit)]


def set_priority(table: str, job_id: str, priority: int, actor: str, now: datetime) -> str:
    """Change a job's priority and its order key together, while it has not started (queued or
    held), so a waiting job moves to its new place at once. Returns the new order key.

    Conditional on the queue_seq read and on the status, so a concurrent change or a start makes
    the caller read again (StatusChanged).
    """
    response = client("dynamodb").get_item(
        TableName=table,
        Key=key(job_pk(job_id), JOB_SK),
        ConsistentRead=True,
        ProjectionExpression="queue_seq, #status",
        ExpressionAttributeNames={"#status": "status"},
    )
    record = from_attributes(response.get("Item") or {})
    if "queue_seq" not in record:
        raise StatusChanged(job_id)
    order = wait_order(priority, int(record["queue_seq"]), job_id)
    try:
        client("dynamodb").update_item(
            TableName=table,
            Key=key(job_pk(job_id), JOB_SK),
            UpdateExpression=f"SET priority = :priority, {WAIT_ORDER_ATTRIBUTE} = :order, last_writer = "
            ":actor, updated_at = :now",
            ConditionExpression="queue_seq = :seq AND #status IN (:queued, :held)",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues=to_attributes(
                {
                    ":priority": priority,
                    ":order": order,
                    ":actor": f"operator:{actor}",
                    ":now": now.isoformat(),
                    ":seq": int(record["queue_seq"]),
                    ":queued": JobStatus.QUEUED.value,
                    ":held": JobStatus.HELD.value,
                }
            ),
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            raise StatusChanged(job_id) from exc
        raise
    return order


def drop_waiter(table: str, project_id: str, job_id: str) -> bool:
    """Take a job out of its project's waiting order (its execution ended, or it was canceled).

    Safe to repeat. The job's index entry goes first and the lock's `waiters` entry last, so an
    interrupted drop is still found (through `waiters`) and finished by the next sweep. Leaving
    moves the lock's wake_seq, like a release: the job may have headed the line, and a waiter
    about to park behind it reads the lock again. False if the job was no longer a waiter.
    """
    update_if(  # refused when the job record has expired: nothing to remove
        TableName=table,
        Key=key(job_pk(job_id), JOB_SK),
        UpdateExpression=f"REMOVE {WAITING_FOR_ATTRIBUTE}, {WAKE_TOKEN_ATTRIBUTE}",
        ConditionExpression="attribute_exists(pk)",
    )
    return update_if(
        TableName=table,
        Key=key(lock_pk(project_id), LOCK_SK),
        UpdateExpression="DELETE waiters :me ADD wake_seq :one",
        ConditionExpression="contains(waiters, :name)",
        ExpressionAttributeValues={":me": {"SS": [job_id]}, ":name": {"S": job_id}, ":one": {"N": "1"}},
    )


def head_wake_token(table: str, project_id: str) -> str | None:
    """The task token the first job of the project's waiting order parked with (job.asl.json's
    WaitForProject keeps it on the job record), or None when nobody waits or the head is
    between two parks. Read strongly consistent from the record: the index is eventually
    consistent and only says who is first."""
    head = waiting_jobs(table, project_id, limit=1)
    if not head:
        return None
    response = client("dynamodb").get_item(
        TableName=table,
        Key=key(job_pk(head[0]), JOB_SK),
        ConsistentRead=True,
        ProjectionExpression=WAKE_TOKEN_ATTRIBUTE,
    )
    return from_attributes(response.get("Item") or {}).get(WAKE_TOKEN_ATTRIBUTE)
