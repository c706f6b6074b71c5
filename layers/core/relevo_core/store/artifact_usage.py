"""Access pattern: a project's running artifact total (artifact.max_total_bytes), kept without scans.

One item per project, `USAGE#{project}` / `ARTIFACTS`, holds `bytes`: the sizes of the project's
artifact records that are stored (not removed by the quota). Two writers change it:

- the table-stream consumer (functions/artifact_quota) adds the change each artifact record's
  stream record carries: an upload (+size), a retry replacing a path (+new -old), a job delete or
  a TTL expiry of a stored record (-size). Lambda's event source mappings "process each event at
  least once, and duplicate processing of records can occur" (AWS Lambda Developer Guide, "How
  Lambda processes records from stream and queue-based event sources"), while DynamoDB Streams
  gives "each stream record appears exactly once in the stream" with a per-item order (DynamoDB
  Developer Guide, "Change data capture for DynamoDB Streams"). So each ADD goes in one
  TransactWriteItems with a conditional Put of a marker named by the stream record's eventID
  ("a globally unique identifier for the event", DynamoDB Streams API Record): a redelivered
  record finds its marker and adds nothing. Markers live past the stream's 24-hour retention.
- the quota's remover (`remove_for_quota`): the mark on the artifact record, the decrement and the
  audit entry in one transaction, conditional on the record still being stored and on the total
  covering its size, so a record is removed once and the total never goes below zero. The stream
  consumer leaves that record's stored -> removed change alone (it was counted here).

Counting in the agent's fenced upload transaction was the other choice; it would still miss TTL
expiries (deleted by DynamoDB itself, no transaction of ours) and add a write to every upload.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_core.store.artifacts import ArtifactRecord
from relevo_core.store.codec import from_attributes, to_attribute
from relevo_core.store.conditional import CONDITION_FAILED, transaction_cancellation, update_if
from relevo_core.store.keys import ARTIFACT_USAGE_SK, COUNTED_SK_PREFIX, artifact_pk, audit_pk, key, usage_pk

# Stream records are kept 24 hours; a marker outlives any redelivery of its record.
COUNTED_MARKER_TTL_SEC = 3 * 24 * 3600
QUOTA_REASON = "artifact.max_total_bytes"


@dataclass(frozen=True)
class Usage:
    bytes: int
    # When the project was first seen over its bound with only live jobs' artifacts left to remove.
    live_over_bound_at: str | None


def _cancelled_on_condition(exc: ClientError) -> bool:
    """A transaction refused by one of its items' conditions (not throttled, not a conflict)."""
    cancellation = transaction_cancellation(exc)
    return cancellation is not None and CONDITION_FAILED in cancellation.codes


def add_counted(table: str, project_id: str, event_id: str, delta: int, now_epoch: int) -> bool:
    """Add `delta` to the project's total once per stream record `event_id`; False if it was
    already counted."""
    try:
        client("dynamodb").transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": table,
                        "Item": {
                            **key(usage_pk(project_id), f"{COUNTED_SK_PREFIX}{event_id}"),
                            "delta": to_attribute(delta),
                            "ttl": to_attribute(now_epoch + COUNTED_MARKER_TTL_SEC),
                        },
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {
                    "Update": {
                        "TableName": table,
                        "Key": key(usage_pk(project_id), ARTIFACT_USAGE_SK),
                        "UpdateExpression": "ADD #bytes :delta",
                        "ExpressionAttributeNames": {"#bytes": "bytes"},
                        "ExpressionAttributeValues": {":delta": to_attribute(delta)},
                    }
                },
            ]
        )
    except ClientError as exc:
        if _cancelled_on_condition(exc):
            return False
        raise
    return True


def get_usage(table: str, project_id: str) -> Usage:
    response = client("dynamodb").get_item(
        TableName=table, Key=key(usage_pk(project_id), ARTIFACT_USAGE_SK), ConsistentRead=True
    )
    item = from_attributes(response.get("Item") or {})
    return Usage(bytes=int(item.get("bytes", 0)), live_over_bound_at=item.get("live_over_bound_at"))


def remove_for_quota(
    table: str, project_id: str, artifact: ArtifactRecord, bound: int, total: int, at: datetime
) -> bool:
    """Mark the artifact removed, take its size off the total and write the job's audit entry, in
    one transaction. False when the record is gone, already removed, was replaced since it was
    read, or is not counted in the total yet: nothing is written then."""
    when = at.isoformat()
    try:
        client("dynamodb").transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": table,
                        "Key": key(artifact_pk(artifact.job_id), artifact.sk),
                        "UpdateExpression": "SET removed_at = :at, removed_reason = :reason",
                        "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(removed_at) "
                        "AND uploaded_at = :uploaded AND attempt = :attempt",
                        "ExpressionAttributeValues": {
                            ":at": to_attribute(when),
                            ":reason": to_attribute(QUOTA_REASON),
                            ":uploaded": to_attribute(artifact.uploaded_at),
                            ":attempt": to_attribute(artifact.attempt),
                        },
                    }
                },
                {
                    "Update": {
                        "TableName": table,
                        "Key": key(usage_pk(project_id), ARTIFACT_USAGE_SK),
                        "UpdateExpression": "ADD #bytes :minus",
                        "ConditionExpression": "#bytes >= :size",
                        "ExpressionAttributeNames": {"#bytes": "bytes"},
                        "ExpressionAttributeValues": {
                            ":minus": to_attribute(-artifact.size),
                            ":size": to_attribute(artifact.size),
                        },
                    }
                },
                {
                    "Put": {
                        "TableName": table,
                        "Item": {
                            **key(
                                audit_pk(artifact.job_id),
                                f"{when}#artifact_removed#{artifact.stage}/{artifact.path}",
                            ),
                            "action": to_attribute("artifact_removed"),
                            "actor": to_attribute("relevo"),
                            "at": to_attribute(when),
                            "stage": to_attribute(artifact.stage),
                            "path": to_attribute(artifact.path),
                            "size": to_attribute(artifact.size),
                            "reason": to_attribute(
                                f"{QUOTA_REASON} {bound}: the project's artifacts totalled {total} bytes"
                            ),
                        },
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
            ]
        )
    except ClientError as exc:
        if _cancelled_on_condition(exc):
            return False
        raise
    return True


def _update_usage_if(
    table: str, project_id: str, update: str, condition: str, values: dict[str, Any] | None = None
) -> bool:
    """A conditional update of the project's usage item; False when the condition did not hold."""
    return update_if(
        TableName=table,
        Key=key(usage_pk(project_id), ARTIFACT_USAGE_SK),
        UpdateExpression=update,
        ConditionExpression=condition,
        **({"ExpressionAttributeValues": values} if values else {}),
    )


def note_live_over_bound(table: str, project_id: str, at: datetime) -> bool:
    """Record that only live jobs' artifacts are left over the bound; True the first time only
    (until `clear_live_over_bound`), so it is logged once."""
    return _update_usage_if(
        table,
        project_id,
        "SET live_over_bound_at = :at",
        "attribute_not_exists(live_over_bound_at)",
        {":at": to_attribute(at.isoformat())},
    )


def clear_live_over_bound(table: str, project_id: str) -> None:
    _update_usage_if(table, project_id, "REMOVE live_over_bound_at", "attribute_exists(live_over_bound_at)")


def counted_bytes(image: dict[str, Any] | None) -> int:
    """What one artifact record's image counts in the total: its size while stored."""
    if not image or image.get("removed_at"):
        return 0
    return int(image.get("size", 0))
