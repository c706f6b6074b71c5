"""Access pattern: the jobs of one project by creation time, newest first (ProjectJobsIndex)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from relevo_core.store.keys import PROJECT_JOBS_ATTRIBUTE, PROJECT_JOBS_INDEX
from relevo_core.store.paging import query_items


def jobs_of_project(
    table: str,
    project_id: str,
    since: str | None = None,
    until: str | None = None,
    oldest_first: bool = False,
) -> Iterator[dict[str, Any]]:
    """Job records of a project created in [since, until] (ISO 8601 UTC), newest first (or
    oldest first: the artifact quota removes from there).

    Only job records carry the index's key attribute (PROJECT_JOBS_ATTRIBUTE), so the index
    holds nothing else."""
    condition = f"{PROJECT_JOBS_ATTRIBUTE} = :project"
    values: dict[str, Any] = {":project": {"S": project_id}}
    if since and until:
        condition += " AND created_at BETWEEN :since AND :until"
        values[":since"], values[":until"] = {"S": since}, {"S": until}
    elif since:
        condition += " AND created_at >= :since"
        values[":since"] = {"S": since}
    elif until:
        condition += " AND created_at <= :until"
        values[":until"] = {"S": until}
    return query_items(
        TableName=table,
        IndexName=PROJECT_JOBS_INDEX,
        KeyConditionExpression=condition,
        ExpressionAttributeValues=values,
        ScanIndexForward=oldest_first,
    )
