"""Access pattern: a job's stage records, in plan order (one Query of the job's partition): what the
reporter's stage summary and the job listing's progress, agents and duration read."""

from __future__ import annotations

from typing import Any

from relevo_core.store.keys import is_stage_sk, stages_pk
from relevo_core.store.paging import query_items


def stage_records(table: str, job_id: str) -> list[dict[str, Any]]:
    """The stages' own records, one a stage: a stage with shards keeps its shards' apart."""
    return [item for item in query_items(
        TableName=table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :stage)",
        ExpressionAttributeValues={":pk": {"S": stages_pk(job_id)}, ":stage": {"S": "STAGE#"}},
        ProjectionExpression="sk, stage_name, #status, attempt, agent_id, error_class, retry_count, started_at, ended_at",
        ExpressionAttributeNames={"#status": "status"},
    ) if is_stage_sk(str(item["sk"]))]
