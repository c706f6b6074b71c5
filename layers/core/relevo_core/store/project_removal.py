"""Access pattern: a project's removal, its whole `PROJECT#` partition (the declaration and every
grant on it), read by key and deleted item by item. Repeating it after an interruption finishes it;
the declaration goes last, so an interrupted removal leaves the project listed."""

from __future__ import annotations

from relevo_core.aws import client
from relevo_core.store.keys import PROJECT_SK, key, project_pk
from relevo_core.store.paging import query_items


def delete_project_partition(table: str, project_id: str) -> int:
    """Delete the project's items (grants first, the declaration last); how many there were."""
    keys = [
        item["sk"]
        for item in query_items(
            TableName=table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": project_pk(project_id)}},
            ProjectionExpression="sk",
            ConsistentRead=True,
        )
    ]
    dynamodb = client("dynamodb")
    for sk in sorted(keys, key=lambda sk: sk == PROJECT_SK):
        dynamodb.delete_item(TableName=table, Key=key(project_pk(project_id), sk))
    return len(keys)
