"""Access pattern: every item of one kind (projects, locks), through KindIndex, without scans."""

from __future__ import annotations

from typing import Any, Iterator

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes
from relevo_core.store.keys import KIND_INDEX


def items_of_kind(table: str, kind: str) -> Iterator[dict[str, Any]]:
    kwargs: dict[str, Any] = {
        "TableName": table,
        "IndexName": KIND_INDEX,
        "KeyConditionExpression": "kind = :kind",
        "ExpressionAttributeValues": {":kind": {"S": kind}},
    }
    while True:
        page = client("dynamodb").query(**kwargs)
        yield from (from_attributes(item) for item in page["Items"])
        if "LastEvaluatedKey" not in page:
            return
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
