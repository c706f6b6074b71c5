"""Access pattern: a job's stage records, in plan order (one Query of the job's partition): what the
reporter's stage summary and the job listing's progress, agents, duration and the commit its first
checkout resolved read. A stage with
shards keeps each shard's attempt on a record of its own (STAGE#nn#SHARD#kk) beside the stage's."""

from __future__ import annotations

from typing import Any, NamedTuple

from relevo_core.store.keys import is_stage_sk, shard_of_sk, stages_pk
from relevo_core.store.paging import query_items


class StageRecords(NamedTuple):
    """A job's records under STAGES#: the stages' own, one a stage, and its shards', in key order."""

    stages: list[dict[str, Any]]
    shards: list[dict[str, Any]]


def stage_and_shard_records(table: str, job_id: str) -> StageRecords:
    items = query_items(
        TableName=table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :stage)",
        ExpressionAttributeValues={":pk": {"S": stages_pk(job_id)}, ":stage": {"S": "STAGE#"}},
        ProjectionExpression="sk, stage_name, shard_index, #status, attempt, agent_id, error_class, "
        "retry_count, started_at, ended_at, "
        "checkout_commit, reconciled, reconciliations, tests",
        ExpressionAttributeNames={"#status": "status"},
    )
    stages, shards = [], []
    for item in items:
        if is_stage_sk(str(item["sk"])):
            stages.append(item)
        elif shard_of_sk(str(item["sk"])) is not None:
            shards.append(item)
    return StageRecords(stages, shards)


def stage_records(table: str, job_id: str) -> list[dict[str, Any]]:
    """The stages' own records, one a stage: a stage with shards keeps its shards' apart."""
    return stage_and_shard_records(table, job_id).stages
