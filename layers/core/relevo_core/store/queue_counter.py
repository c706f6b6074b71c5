"""Access pattern: the count of queued jobs, one item (COUNTER#queued), moved by ADD inside the
transactions that queue a job or end a queued one: a job takes a slot only below the limit."""

from __future__ import annotations

from typing import Any

from relevo_core.store.keys import COUNTER_SK, QUEUE_COUNTER_PK, key


def queue_counter_update(table: str, limit: int, delta: int) -> dict[str, Any]:
    update: dict[str, Any] = {
        "TableName": table,
        "Key": key(QUEUE_COUNTER_PK, COUNTER_SK),
        "UpdateExpression": "SET queued = if_not_exists(queued, :zero) + :delta",
        "ExpressionAttributeValues": {":zero": {"N": "0"}, ":delta": {"N": str(delta)}},
    }
    if delta > 0:
        update["ConditionExpression"] = "attribute_not_exists(queued) OR queued < :limit"
        update["ExpressionAttributeValues"][":limit"] = {"N": str(limit)}
        update["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    return {"Update": update}
