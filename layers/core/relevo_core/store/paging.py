"""Every page of a DynamoDB Query, as plain Python items."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes


def query_items(**kwargs: Any) -> Iterator[dict[str, Any]]:
    while True:
        page = client("dynamodb").query(**kwargs)
        yield from (from_attributes(item) for item in page["Items"])
        if "LastEvaluatedKey" not in page:
            return
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
