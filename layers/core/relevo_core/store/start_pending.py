"""Access pattern: the jobs whose execution has not run its first state (StartPendingIndex, sparse:
written with a queued job, removed by the execution's first state), for the sweeper."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes
from relevo_core.store.keys import (
    JOB_SK,
    START_PENDING,
    START_PENDING_ATTRIBUTE,
    START_PENDING_INDEX,
    job_pk,
    key,
)


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
