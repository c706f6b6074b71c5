"""Access pattern: which stages of a job succeeded, read stage record by stage record (GetItem on
`STAGE#nn`; a job has at most 32). What a job resumed from a later stage stands on."""

from __future__ import annotations

from relevo_core.aws import client
from relevo_core.models.status import SUCCEEDED_STAGE
from relevo_core.store.codec import from_attributes
from relevo_core.store.keys import stage_key


def succeeded_indexes(table: str, job_id: str, indexes: range) -> set[int]:
    """The indexes among `indexes` whose stage record says succeeded."""
    dynamodb = client("dynamodb")
    found = set()
    for index in indexes:
        item = dynamodb.get_item(
            TableName=table,
            Key=stage_key(job_id, index),
            ConsistentRead=True,
            ProjectionExpression="#status",
            ExpressionAttributeNames={"#status": "status"},
        ).get("Item")
        if item and from_attributes(item).get("status") in SUCCEEDED_STAGE:
            found.add(index)
    return found
