"""Access pattern: every item of one kind (projects, locks), through KindIndex, without scans."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from relevo_core.store.keys import KIND_INDEX
from relevo_core.store.paging import query_items


def items_of_kind(table: str, kind: str) -> Iterator[dict[str, Any]]:
    return query_items(
        TableName=table,
        IndexName=KIND_INDEX,
        KeyConditionExpression="kind = :kind",
        ExpressionAttributeValues={":kind": {"S": kind}},
    )
