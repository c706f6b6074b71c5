"""Access pattern: a job's envelope and its status projection, written once and read whole."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_core.models.envelope import JobEnvelope, read_envelope
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import JobStatus, StageStatus
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.keys import DEDUP_SK, JOB_SK, dedup_pk, job_pk, key


@dataclass(frozen=True)
class CreateResult:
    job_id: str
    created: bool  # False: the idempotency key already had a live job


def create_job(table: str, envelope: JobEnvelope, dedup_window_sec: int, now: datetime) -> CreateResult:
    """Write the dedup record and the envelope in one transaction, or neither.

    A live dedup record for the same key makes the transaction fail; DynamoDB then returns the
    existing record (ReturnValuesOnConditionCheckFailure), so a duplicate costs one call.
    """
    epoch = int(now.timestamp())
    dedup_until = epoch + dedup_window_sec
    dedup_item = {
        "pk": dedup_pk(envelope.idempotency_key),
        "sk": DEDUP_SK,
        "job_id": envelope.job_id,
        "expires_at": dedup_until,
        "ttl": dedup_until,
    }
    job_item = {
        "pk": job_pk(envelope.job_id),
        "sk": JOB_SK,
        "envelope": envelope.to_json_dict(),
        "schema_version": envelope.schema_version,
        "job_id": envelope.job_id,
        "project": envelope.project,
        "status": JobStatus.QUEUED.value,
        "priority": envelope.priority,
        "created_at": envelope.created_at.isoformat(),
        "updated_at": now.isoformat(),
        "last_writer": "intake",
        "ttl": envelope.ttl,
    }
    try:
        client("dynamodb").transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": table,
                        "Item": to_attributes(dedup_item),
                        "ConditionExpression": "attribute_not_exists(pk) OR expires_at < :now",
                        "ExpressionAttributeValues": {":now": {"N": str(epoch)}},
                        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                    }
                },
                {
                    "Put": {
                        "TableName": table,
                        "Item": to_attributes(job_item),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
            ]
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "TransactionCanceledException":
            raise
        reasons = exc.response.get("CancellationReasons") or []
        if reasons and reasons[0].get("Code") == "ConditionalCheckFailed" and reasons[0].get("Item"):
            existing = from_attributes(reasons[0]["Item"])
            return CreateResult(job_id=str(existing["job_id"]), created=False)
        raise
    return CreateResult(job_id=envelope.job_id, created=True)


def query_job_items(table: str, job_id: str) -> list[dict[str, Any]]:
    """All items under a job (its record and its stages), in key order."""
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk",
        "ExpressionAttributeValues": {":pk": {"S": job_pk(job_id)}},
        "ConsistentRead": True,
    }
    while True:
        page = client("dynamodb").query(**kwargs)
        items.extend(from_attributes(item) for item in page["Items"])
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def get_envelope(table: str, job_id: str) -> JobEnvelope:
    response = client("dynamodb").get_item(
        TableName=table, Key=key(job_pk(job_id), JOB_SK), ConsistentRead=True, ProjectionExpression="envelope"
    )
    if "Item" not in response:
        raise RelevoError(ErrorCode.JOB_NOT_FOUND, f"no job {job_id!r}")
    return read_envelope(from_attributes(response["Item"])["envelope"])


def job_items_to_view(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge a job's record and stage records into one read model, stages in plan order."""
    record = next((item for item in items if item["sk"] == JOB_SK), None)
    if record is None:
        raise RelevoError(ErrorCode.JOB_NOT_FOUND, "no such job")
    envelope = read_envelope(record["envelope"])
    stage_records = {item.get("stage_name"): item for item in items if item["sk"].startswith("STAGE#")}
    stages = []
    for index, stage in enumerate(envelope.stages):
        found = stage_records.get(stage.name, {})
        stages.append(
            {
                "index": index,
                "name": stage.name,
                "status": found.get("status", StageStatus.PENDING.value),
                "attempt": found.get("attempt"),
                "agent_id": found.get("agent_id"),
                "exit_code": found.get("exit_code"),
                "error_class": found.get("error_class"),
                "dispatched_at": found.get("dispatched_at"),
                "started_at": found.get("started_at"),
                "ended_at": found.get("ended_at"),
                "last_writer": found.get("last_writer"),
            }
        )
    current = next((s["name"] for s in stages if s["status"] in ("dispatched", "running")), None)
    return {
        "job_id": envelope.job_id,
        "project": envelope.project,
        "status": record["status"],
        "trigger": envelope.trigger.model_dump(mode="json"),
        "ref": envelope.ref,
        "commit": envelope.commit,
        "region_affinity": envelope.region_affinity,
        "priority": record.get("priority", envelope.priority),
        "created_at": record.get("created_at"),
        "updated_at": record.get("updated_at"),
        "ended_at": record.get("ended_at"),
        "current_stage": current,
        "last_successful_stage": record.get("last_successful_stage"),
        "last_writer": record.get("last_writer"),
        "error": record.get("error_name"),
        "error_cause": record.get("error_cause"),
        "stages": stages,
    }
