"""Access pattern: the audit trail of a job (who did what to it, when and why)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.keys import audit_pk


def record_action(table: str, job_id: str, action: str, actor: str, at: datetime, **details: Any) -> None:
    item = {
        "pk": audit_pk(job_id),
        "sk": f"{at.isoformat()}#{action}",
        "action": action,
        "actor": actor,
        "at": at.isoformat(),
    }
    item.update({name: value for name, value in details.items() if value is not None})
    client("dynamodb").put_item(TableName=table, Item=to_attributes(item))


def actions(table: str, job_id: str) -> list[dict[str, Any]]:
    response = client("dynamodb").query(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": audit_pk(job_id)}},
        ConsistentRead=True,
    )
    return [from_attributes(item) for item in response["Items"]]
