"""Access pattern: delivery records, under their project's partition, sorted by time.

Each record expires on its own TTL (DELIVERY_RECORD_DAYS), not with the job it is about. Three
ways in: one PutItem per record (outgoing attempts, ignored webhook deliveries); a Put inside the
transaction that creates the job an accepted delivery asked for, so the record costs no call of
its own and exists exactly when the job does; and at most one record of refused deliveries per
project and minute, a conditional PutItem under the minute's own key.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from relevo_core.aws import client
from relevo_core.models.delivery import DeliveryRecord
from relevo_core.store.codec import to_attributes
from relevo_core.store.conditional import put_if
from relevo_core.store.keys import (
    DELIVERY_LOG_SK_PREFIX,
    delivery_log_pk,
    delivery_log_sk,
    refused_minute_sk,
)
from relevo_core.store.paging import query_items


def _item(record: DeliveryRecord, ttl: int, sk: str) -> dict[str, Any]:
    return to_attributes(
        {
            "pk": delivery_log_pk(record.project),
            "sk": sk,
            "record": record.model_dump(mode="json", exclude_none=True),
            "failed": record.outcome.failed,
            "ttl": ttl,
        }
    )


def record_delivery(table: str, record: DeliveryRecord, ttl: int) -> None:
    # The random tail keeps two attempts of one millisecond apart.
    client("dynamodb").put_item(
        TableName=table, Item=_item(record, ttl, delivery_log_sk(record.at, secrets.token_hex(4)))
    )


def delivery_put(table: str, record: DeliveryRecord, ttl: int) -> dict[str, Any]:
    """The record as one Put of a TransactWriteItems: written with the rest of the transaction, or
    not at all. Unconditional, under a key nobody else writes: it never cancels the transaction."""
    return {
        "Put": {
            "TableName": table,
            "Item": _item(record, ttl, delivery_log_sk(record.at, secrets.token_hex(4))),
        }
    }


def record_refusal_of_minute(table: str, record: DeliveryRecord, ttl: int, at: datetime) -> bool:
    """Store `record` (a delivery refused `at`) under the key of `at`'s minute unless the project
    already has a record of that minute; True when this call stored it.

    One conditional PutItem. A refused condition is DynamoDB's ConditionalCheckFailedException
    ("PutItem", DynamoDB API Reference: nothing is written), and a failed conditional write still
    consumes write capacity ("DynamoDB read and write operations", Developer Guide): hence the
    caller makes this call at most once per project and minute in each container.
    """
    item = _item(record, ttl, refused_minute_sk(at))
    return put_if(TableName=table, Item=item, ConditionExpression="attribute_not_exists(pk)")


def project_deliveries(
    table: str, project_id: str, failed_only: bool = False, limit: int = 200
) -> list[DeliveryRecord]:
    """The project's delivery records, newest first."""
    request: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk AND begins_with(sk, :at)",
        "ExpressionAttributeValues": {
            ":pk": {"S": delivery_log_pk(project_id)},
            ":at": {"S": DELIVERY_LOG_SK_PREFIX},
        },
        "ScanIndexForward": False,
    }
    if failed_only:
        request["FilterExpression"] = "failed = :yes"
        request["ExpressionAttributeValues"][":yes"] = {"BOOL": True}
    records = []
    for item in query_items(**request):
        records.append(DeliveryRecord.model_validate(item["record"]))
        if len(records) >= limit:
            break
    return records
