"""Access pattern: the job records in one status, of every project or of one (JobStatusIndex).

The index's range key is project_jobs, which only job records carry, so the stage records (which
have a status of their own) are not in it. Reading the live statuses (queued, running, waiting)
this way costs the live jobs only, however many ended jobs the projects keep."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from relevo_core.store.keys import JOB_STATUS_INDEX, PROJECT_JOBS_ATTRIBUTE
from relevo_core.store.paging import query_items


def jobs_with_status(table: str, status: str, project_id: str | None = None) -> Iterator[dict[str, Any]]:
    """Job records whose status is `status` (of `project_id` only, when given), by project."""
    condition = "#status = :status"
    values: dict[str, Any] = {":status": {"S": status}}
    if project_id is not None:
        condition += f" AND {PROJECT_JOBS_ATTRIBUTE} = :project"
        values[":project"] = {"S": project_id}
    return query_items(
        TableName=table,
        IndexName=JOB_STATUS_INDEX,
        KeyConditionExpression=condition,
        ExpressionAttributeNames={"#status": "status"},
        ExpressionAttributeValues=values,
    )
