"""Access pattern: the newest transition of a job each commit-status target was told of.

A commit status (and a check run) is one value per context that each report overwrites, so a
report older than one already delivered must never be sent after it: a dead-lettered `pending`
replayed after `success` was delivered would turn a green commit back to pending. Each delivery
raises the job's mark for its target to the moment its transition was written (the job
record's `updated_at`), on condition that it only goes up (DynamoDB Developer Guide, "Condition
expressions"); a report older than the mark is superseded.
"""

from __future__ import annotations

from relevo_core.aws import client
from relevo_core.store.codec import to_attributes
from relevo_core.store.conditional import update_if
from relevo_core.store.keys import key, latest_report_sk, notice_pk


def latest_reported_at(table: str, job_id: str, target: str) -> float | None:
    """When the newest transition delivered to `target` for the job was written (epoch seconds)."""
    item = (
        client("dynamodb")
        .get_item(TableName=table, Key=key(notice_pk(job_id), latest_report_sk(target)), ConsistentRead=True)
        .get("Item")
    )
    return float(item["at"]["N"]) if item else None


def raise_latest_reported(table: str, job_id: str, target: str, at: float, ttl: int) -> bool:
    """The job's mark for `target` raised to `at`; False when it already was as high or higher."""
    return update_if(
        TableName=table,
        Key=key(notice_pk(job_id), latest_report_sk(target)),
        UpdateExpression="SET #at = :at, #ttl = :ttl",
        ConditionExpression="attribute_not_exists(#at) OR #at < :at",
        ExpressionAttributeNames={"#at": "at", "#ttl": "ttl"},
        ExpressionAttributeValues=to_attributes({":at": at, ":ttl": ttl}),
    )
