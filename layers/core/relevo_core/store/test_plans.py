"""Access pattern: a sharded stage's test plan on its job (JOB#<job>, TESTPLAN#<stage index>),
made once per stage of a job: the first shard to ask writes it with a conditional put, the others
read the one on record (as a job's build number is given once: store/build_numbers).

Why a conditional put and ALL_OLD: two shards of one stage ask at the same instant, each with
the plan it made; `attribute_not_exists(pk)` lets one write (DynamoDB Developer Guide, "Condition
expressions"), and the other's refusal carries the item that won
(ReturnValuesOnConditionCheckFailure ALL_OLD, DynamoDB API Reference, "PutItem"), so it answers
with that plan without a read of its own.

The record holds what the job view shows (how it was split, each shard's tests and expected
seconds) and where the whole plan is (`plan_key` under the job's prefix, its sha256): a plan of
100,000 ids would not fit in an item (400 KB: DynamoDB Developer Guide, "Quotas")."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.keys import job_pk, key, test_plan_sk

# The attributes of the record (the claim function's IAM grant names exactly these).
ATTRIBUTES = (
    "pk",
    "sk",
    "stage",
    "listing_sha256",
    "plan_key",
    "plan_sha256",
    "by",
    "history_jobs",
    "allow_empty",
    "shards",
    "made_by",
    "made_at",
    "ttl",
)


def plan_on_record(table: str, job_id: str, stage_index: int) -> dict[str, Any] | None:
    response = client("dynamodb").get_item(
        TableName=table, Key=key(job_pk(job_id), test_plan_sk(stage_index)), ConsistentRead=True
    )
    item = response.get("Item")
    return from_attributes(item) if item else None


def record_plan(
    table: str, job_id: str, stage_index: int, record: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """(the plan on record, whether this call wrote it): `record` when it is the first, else the
    one another shard wrote first."""
    item = {**record, **from_attributes(key(job_pk(job_id), test_plan_sk(stage_index)))}
    try:
        client("dynamodb").put_item(
            TableName=table,
            Item=to_attributes(item),
            ConditionExpression="attribute_not_exists(pk)",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except ClientError as exc:
        if error_code(exc) != "ConditionalCheckFailedException":
            raise
        return from_attributes(exc.response.get("Item", {})), False  # type: ignore[arg-type]  # stubs lack Item
    return item, True


def shown(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the job view shows of a stage's plan: how it was split, each shard's tests and
    expected seconds (the whole plan is at its key, under the job's prefix)."""
    if record is None:
        return None
    return {
        name: record.get(name) for name in ("by", "history_jobs", "allow_empty", "shards", "listing_sha256")
    }
