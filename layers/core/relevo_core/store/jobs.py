"""Access pattern: a job's record (its frozen envelope and its status projection) and its stage
records, read whole; the approval gate's decision written on it. The record is written by
store/job_creation, its status moved by store/job_status."""

from __future__ import annotations

from typing import Any

from relevo_core.aws import client, in_this_context, side_by_side
from relevo_core.models.envelope import JobEnvelope, read_envelope
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.store.codec import ENVELOPE, PACKED_ENVELOPE, envelope_of, from_attributes, to_attributes
from relevo_core.store.keys import DLQ_SK, JOB_SK, dlq_pk, job_pk, key, stages_pk
from relevo_core.store.paging import query_items


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
        TableName=table,
        Key=key(job_pk(job_id), JOB_SK),
        ConsistentRead=True,
        ProjectionExpression=f"{PACKED_ENVELOPE}, {ENVELOPE}",
    )
    if "Item" not in response:
        raise RelevoError(ErrorCode.JOB_NOT_FOUND, f"no job {job_id!r}")
    return read_envelope(envelope_of(from_attributes(response["Item"])))
