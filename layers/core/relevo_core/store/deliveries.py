"""Access pattern: delivery records, under their project's partition, sorted by time.

Each record expires on its own TTL (DELIVERY_RECORD_DAYS), not with the job it is about.
"""

from __future__ import annotations

import secrets
from typing import Any

from relevo_core.aws import client
from relevo_core.models.delivery import DeliveryRecord
from relevo_core.store.codec import to_attributes
from relevo_core.store.keys import DELIVERY_LOG_SK_PREFIX, delivery_log_pk
from relevo_core.store.paging import query_items


def record_delivery(table: str, record: DeliveryRecord, ttl: int) -> None:
    item: dict[str, Any] = {
        "pk": delivery_log_pk(record.project),
        # The time sorts the partition; the random tail keeps two attempts of one millisecond apart.
        "sk": f"{DELIVERY_LOG_SK_PREFIX}{record.at}#{secrets.token_hex(4)}",
        "record": record.model_dump(mode="json", exclude_none=True),
        "failed": record.outcome.failed,
        "ttl": ttl,
    }
    client("dynamodb").put_item(TableName=table, Item=to_attributes(item))


def project_deliveries(table: str, project_id: str, failed_only: bool = False, limit: int = 200) -> list[DeliveryRecord]:
    """The project's delivery records, newest first."""
    request: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk AND begins_with(sk, :at)",
        "ExpressionAttributeValues": {":pk": {"S": delivery_log_pk(project_id)}, ":at": {"S": DELIVERY_LOG_SK_PREFIX}},
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
