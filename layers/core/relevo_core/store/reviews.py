"""Access pattern: a stage waiting for an operator after reconciliation (manual_review), and the
operator's resolution recorded on it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.models.status import StageStatus
from relevo_core.store.codec import from_attributes, to_attribute
from relevo_core.store.keys import stage_key


class NotInReview(Exception):
    """The stage is not (or no longer) waiting for a resolution with that token."""


def review(table: str, job_id: str, stage_index: int, shard: int | None = None) -> dict[str, Any]:
    """The stage record's (or the shard's) status, the attempt in review and the reconciliation evidence ({}
    if none)."""
    item = (
        client("dynamodb")
        .get_item(
            TableName=table,
            Key=stage_key(job_id, stage_index, shard),
            ConsistentRead=True,
            ProjectionExpression="#status, review_attempt, reconciled",
            ExpressionAttributeNames={"#status": "status"},
        )
        .get("Item", {})
    )
    return from_attributes(item)


def record_resolution(
    table: str,
    job_id: str,
    stage_index: int,
    review_attempt: int,
    resolution: str,
    actor: str,
    reason: str | None,
    now: datetime,
    shard: int | None = None,
) -> None:
    """Written before the token is answered, and only while the stage still waits in review of
    `review_attempt`: the next attempt then finds the outcome `resolved` and runs without reconciling."""
    entry = {
        "as": resolution,
        "actor": actor,
        "at": now.isoformat(),
        **({"reason": reason} if reason else {}),
    }
    try:
        client("dynamodb").update_item(
            TableName=table,
            Key=stage_key(job_id, stage_index, shard),
            UpdateExpression="SET resolution = :entry, outcome = :resolved, last_writer = :writer",
            ConditionExpression="#status = :review AND review_attempt = :attempt",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={
                ":entry": to_attribute(entry),
                ":resolved": to_attribute("resolved"),
                ":writer": to_attribute(f"operator:{actor}"),
                ":review": to_attribute(StageStatus.MANUAL_REVIEW.value),
                ":attempt": to_attribute(review_attempt),
            },
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            raise NotInReview(f"{job_id} stage {stage_index}") from exc
        raise
