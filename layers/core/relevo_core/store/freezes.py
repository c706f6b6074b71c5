"""Access pattern: dead-letter entries by idempotency key, and the freeze record of a key.

The state machine writes each dead-letter entry with a `freeze_check` marker (sparse
FreezeCheckIndex) and its `idempotency_key` and `failed_at` (DeadLetterKeyIndex). A key's freeze
record (`FREEZE#<key>`) carries `frozen_at` and `kind = frozen_key` only while the key is frozen,
so KindIndex lists exactly the frozen keys; `unfrozen_at` stays after an unfreeze.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.conditional import update_if
from relevo_core.store.keys import (
    DEAD_LETTER_KEY_INDEX,
    DLQ_SK,
    FREEZE_CHECK_ATTRIBUTE,
    FREEZE_CHECK_INDEX,
    FREEZE_CHECK_PENDING,
    FREEZE_SK,
    FROZEN_KEY_KIND,
    dlq_pk,
    freeze_pk,
    key,
)
from relevo_core.store.kinds import items_of_kind
from relevo_core.store.paging import query_items


def pending_checks(table: str) -> list[dict[str, Any]]:
    """Dead-letter entries whose freeze decision is still to be made, oldest failure first."""
    return list(
        query_items(
            TableName=table,
            IndexName=FREEZE_CHECK_INDEX,
            KeyConditionExpression=f"{FREEZE_CHECK_ATTRIBUTE} = :pending",
            ExpressionAttributeValues={":pending": {"S": FREEZE_CHECK_PENDING}},
            # What recovery/key_freeze reads of each: the index returns only what it projects.
            # project is a reserved word ("Reserved words in DynamoDB"): named through an alias.
            ProjectionExpression="job_id, #project, idempotency_key, failed_at",
            ExpressionAttributeNames={"#project": "project"},
        )
    )


def entries_of_key(table: str, idempotency_key: str) -> list[dict[str, Any]]:
    """Every dead-letter entry of one idempotency key (job_id, project, error, failed_at)."""
    return list(
        query_items(
            TableName=table,
            IndexName=DEAD_LETTER_KEY_INDEX,
            KeyConditionExpression="idempotency_key = :key",
            ExpressionAttributeValues={":key": {"S": idempotency_key}},
            ProjectionExpression="job_id, #project, #error, failed_at",
            ExpressionAttributeNames={"#project": "project", "#error": "error"},
        )
    )


def clear_check(table: str, job_id: str) -> None:
    """The entry's freeze decision is made (safe to repeat)."""
    client("dynamodb").update_item(
        TableName=table,
        Key=key(dlq_pk(job_id), DLQ_SK),
        UpdateExpression=f"REMOVE {FREEZE_CHECK_ATTRIBUTE}",
        ConditionExpression="attribute_exists(pk)",
    )


def get_freeze(table: str, idempotency_key: str) -> dict[str, Any]:
    """The key's freeze record, {} if it never was frozen."""
    response = client("dynamodb").get_item(
        TableName=table, Key=key(freeze_pk(idempotency_key), FREEZE_SK), ConsistentRead=True
    )
    return from_attributes(response.get("Item") or {})


def freeze(
    table: str,
    idempotency_key: str,
    project: str,
    entries: list[dict[str, Any]],
    frozen_at: datetime,
    seen_version: int,
) -> bool:
    """Freeze the key, unless it is frozen already or its record changed since it was read
    (`seen_version`). True only for the one call that froze it: that caller notifies."""
    return update_if(
        TableName=table,
        Key=key(freeze_pk(idempotency_key), FREEZE_SK),
        UpdateExpression=(
            "SET kind = :kind, frozen_at = :at, #project = :project, idempotency_key = :key, #entries = "
            ":entries, "
            "#version = :next REMOVE notified_at"
        ),
        ConditionExpression="attribute_not_exists(frozen_at) AND (attribute_not_exists(#version) OR "
        "#version = :seen)",
        ExpressionAttributeNames={"#project": "project", "#entries": "entries", "#version": "version"},
        ExpressionAttributeValues=to_attributes(
            {
                ":kind": FROZEN_KEY_KIND,
                ":at": frozen_at.isoformat(),
                ":project": project,
                ":key": idempotency_key,
                ":entries": entries,
                ":next": seen_version + 1,
                ":seen": seen_version,
            }
        ),
    )


def mark_notified(table: str, idempotency_key: str, frozen_at: str, now: datetime) -> None:
    """The owner was told about this freeze (not about a later one: refused once unfrozen)."""
    update_if(
        TableName=table,
        Key=key(freeze_pk(idempotency_key), FREEZE_SK),
        UpdateExpression="SET notified_at = :now",
        ConditionExpression="frozen_at = :at",
        ExpressionAttributeValues=to_attributes({":now": now.isoformat(), ":at": frozen_at}),
    )


def unfreeze(table: str, idempotency_key: str, actor: str, now: datetime) -> dict[str, Any]:
    """Lift the freeze; the record keeps when and by whom. Returns the record as it was."""
    try:
        response = client("dynamodb").update_item(
            TableName=table,
            Key=key(freeze_pk(idempotency_key), FREEZE_SK),
            UpdateExpression="SET unfrozen_at = :now, unfrozen_by = :actor, #version = #version + :one "
            "REMOVE kind, frozen_at, notified_at",
            ConditionExpression="attribute_exists(frozen_at)",
            ExpressionAttributeNames={"#version": "version"},
            ExpressionAttributeValues=to_attributes({":now": now.isoformat(), ":actor": actor, ":one": 1}),
            ReturnValues="ALL_OLD",
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            raise RelevoError(
                ErrorCode.KEY_NOT_FROZEN, f"idempotency key {idempotency_key!r} is not frozen"
            ) from exc
        raise
    return from_attributes(response.get("Attributes") or {})


def frozen_keys(table: str) -> list[dict[str, Any]]:
    return list(items_of_kind(table, FROZEN_KEY_KIND))


def not_frozen_check(table: str, idempotency_key: str) -> dict[str, Any]:
    """A transaction item that fails while the key is frozen (intake adds it for automatic runs,
    so refusing them costs no extra call)."""
    return {
        "ConditionCheck": {
            "TableName": table,
            "Key": key(freeze_pk(idempotency_key), FREEZE_SK),
            "ConditionExpression": "attribute_not_exists(frozen_at)",
        }
    }
