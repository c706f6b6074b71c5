"""Access pattern: the artifacts a stage uploaded, one record per file under `ARTIFACTS#{job}`.

Each record is written only while its writer still holds the stage attempt (a ConditionCheck on
the stage item in the same transaction); a later attempt of the same stage overwrites the records
of the same paths. The stage item gets the totals (bytes, cross-region bytes), fenced the same way.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relevo_core.aws import client, error_code
from relevo_core.store.codec import from_attributes, to_attribute, to_attributes
from relevo_core.store.keys import artifact_pk, artifact_sk
from relevo_core.store.stage_attempts import LeaseLost, StageRef, holds_attempt_check

log = logging.getLogger("relevo_core.store.artifacts")


class ArtifactRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str
    stage: str
    path: str  # relative to RELEVO_ARTIFACT_DIR
    uri: str  # s3://bucket/key
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bucket_region: str
    cross_region_bytes: int = Field(ge=0)
    attempt: int
    agent_id: str
    uploaded_at: str
    # Set when artifact.max_total_bytes removed the object (store/artifact_usage.py): the record
    # stays so the job view says what was there and when it went.
    removed_at: str | None = None
    removed_reason: str | None = None
    # "handoff": an object of a stage's handoff (a pack, a blob or its manifest, under
    # `.relevo-handoff/`), stored for the job's later stages: it counts against the artifact
    # bounds and expires with the job's artifacts like any other, but is not one of the files the
    # stage left in RELEVO_ARTIFACT_DIR.
    kind: Literal["artifact", "handoff"] = "artifact"
    # The shard of a stage with shards that stored it (its object under `<stage>/shard-<k>/`);
    # None for a stage without shards.
    shard: int | None = Field(default=None, ge=0)

    @property
    def sk(self) -> str:
        return artifact_sk(self.stage, self.path, self.shard)


def _lease_lost(ref: StageRef, exc: ClientError) -> LeaseLost:
    return LeaseLost(
        f"{ref.job_id} stage {ref.stage_index} attempt {ref.attempt}: {exc.response['Error']['Code']}"
    )


def record(ref: StageRef, artifact: ArtifactRecord, expires_at: int) -> None:
    """`expires_at` (epoch seconds, the TTL attribute) is the job's own `ttl`: the record goes
    with the job. The object in S3 goes by the bucket's lifecycle rule (ArtifactRetentionDays)."""
    item: dict[str, Any] = {
        "pk": artifact_pk(artifact.job_id),
        "sk": artifact.sk,
        **artifact.model_dump(exclude_none=True),
        "ttl": expires_at,
    }
    try:
        client("dynamodb").transact_write_items(
            TransactItems=[
                {"Put": {"TableName": ref.table, "Item": to_attributes(item)}},
                {
                    "ConditionCheck": {
                        "TableName": ref.table,
                        "Key": ref.key,
                        **holds_attempt_check(ref),
                    }
                },
            ]
        )
    except ClientError as exc:
        if error_code(exc) == "TransactionCanceledException":
            raise _lease_lost(ref, exc) from exc
        raise


# One transaction holds at most 100 items ("TransactWriteItems", DynamoDB API Reference): the
# fencing check or update, and 99 records.
_RECORDS_PER_TRANSACTION = 99


def record_handoff(
    ref: StageRef, records: list[ArtifactRecord], summary: dict[str, Any], expires_at: int
) -> None:
    """A stage attempt's handoff objects, and its summary on the stage record (`handoff_stored`,
    what a reconcile of this attempt reads), all fenced on the attempt: the summary goes with the
    last records, every earlier group with a condition check of the same attempt."""
    groups = [
        records[start : start + _RECORDS_PER_TRANSACTION]
        for start in range(0, len(records), _RECORDS_PER_TRANSACTION)
    ] or [[]]
    for number, group in enumerate(groups, start=1):
        fence: dict[str, Any]
        if number < len(groups):
            fence = {"ConditionCheck": {"TableName": ref.table, "Key": ref.key, **holds_attempt_check(ref)}}
        else:
            check = holds_attempt_check(ref, **{":summary": to_attribute(summary)})
            fence = {
                "Update": {
                    "TableName": ref.table,
                    "Key": ref.key,
                    "UpdateExpression": "SET handoff_stored = :summary",
                    **check,
                }
            }
        puts = [
            {
                "Put": {
                    "TableName": ref.table,
                    "Item": to_attributes(
                        {
                            "pk": artifact_pk(r.job_id),
                            "sk": r.sk,
                            **r.model_dump(exclude_none=True),
                            "ttl": expires_at,
                        }
                    ),
                }
            }
            for r in group
        ]
        try:
            client("dynamodb").transact_write_items(TransactItems=[fence, *puts])
        except ClientError as exc:
            if error_code(exc) == "TransactionCanceledException":
                raise _lease_lost(ref, exc) from exc
            raise


class QuotaExceeded(Exception):
    """What a stage would store takes the job past its project's artifact.max_job_bytes."""


def check_job_quota_bytes(
    ref: StageRef, stage: str, adding: int, max_job_bytes: int | None, what: str
) -> None:
    """Before anything is uploaded: the job's artifacts recorded by its other stages (and by this
    stage's other shards) plus `adding` must fit in max_job_bytes. (An earlier attempt of this
    stage, or of this shard, left records the retry's replace: they do not count; a sibling
    shard's are the job's as much as another stage's.) Raises QuotaExceeded, nothing written."""
    if max_job_bytes is None or adding == 0:
        return
    stored = sum(
        record.size
        for record in list_artifacts(ref.table, ref.job_id)
        if (record.stage, record.shard) != (stage, ref.shard) and record.removed_at is None
    )
    if stored + adding > max_job_bytes:
        others = "other stages" if ref.shard is None else "other stages and shards"
        raise QuotaExceeded(
            f"{what} of {adding} bytes would bring the job's artifacts to {stored + adding} bytes, over the "
            "project's "
            f"artifact.max_job_bytes {max_job_bytes} ({others}: {stored} bytes); nothing was uploaded"
        )


def record_totals(ref: StageRef, count: int, total_bytes: int, cross_region_bytes: int) -> None:
    try:
        client("dynamodb").update_item(
            TableName=ref.table,
            Key=ref.key,
            UpdateExpression="SET artifact_count = :count, artifact_bytes = :bytes, cross_region_bytes = "
            ":cross",
            **holds_attempt_check(
                ref,
                **{
                    ":count": to_attribute(count),
                    ":bytes": to_attribute(total_bytes),
                    ":cross": to_attribute(cross_region_bytes),
                },
            ),
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            raise _lease_lost(ref, exc) from exc
        raise


def list_artifacts(table: str, job_id: str, stage: str | None = None) -> list[ArtifactRecord]:
    condition = "pk = :pk"
    values: dict[str, Any] = {":pk": {"S": artifact_pk(job_id)}}
    if stage is not None:
        condition += " AND begins_with(sk, :stage)"
        values[":stage"] = {"S": artifact_sk(stage, "")}
    kwargs: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": condition,
        "ExpressionAttributeValues": values,
        "ConsistentRead": True,
    }
    records: list[ArtifactRecord] = []
    while True:
        page = client("dynamodb").query(**kwargs)
        for item in map(from_attributes, page["Items"]):
            # The job is the partition's (IAM's LeadingKeys holds its writer to it), never the
            # `job_id` attribute its writer chose; a record whose key is not the one its own name
            # gives is not listed (a remover would mark another record than the one it read).
            try:
                found = ArtifactRecord.model_validate({**item, "job_id": job_id})
            except ValidationError as exc:
                log.warning(
                    "artifact record %s %s cannot be read: not listed (%s)",
                    item.get("pk"),
                    item.get("sk"),
                    exc,
                )
                continue
            if found.sk != item.get("sk"):
                log.warning(
                    "artifact record %s %s: its stage, shard and path give %r: not listed",
                    item.get("pk"),
                    item.get("sk"),
                    found.sk,
                )
                continue
            records.append(found)
        if "LastEvaluatedKey" not in page:
            return records
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
