"""Access pattern: what each failed shard of a job's stage left on its own record, for the
dead-letter entry's view.

A stage with shards that fails without fail_fast fails with a summary (its failed shards, the
first one's class): its shards' causes stay out of the execution's state, which Step Functions
bounds (job.asl.json: SummarizeShardFailures). Each shard's record (`STAGE#nn#SHARD#kk`) holds its
own: the state machine's `last_error` and `attempts_log` (every failed attempt: attempt, agent,
error, cause, at), the attempt and backoff its last dispatch wrote. Read with one Query of the
job's stage partition (`STAGES#<job>`, sort keys beginning `STAGE#nn#SHARD#`).
"""

from __future__ import annotations

from typing import Any

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes
from relevo_core.store.keys import SHARD_INFIX, stage_sk, stages_pk


def shard_failures(table: str, job_id: str, stage_index: int, shards: list[int]) -> dict[int, dict[str, Any]]:
    """Each of `shards` of stage `stage_index` of `job_id` whose record is there: its error class,
    attempts, backoff and the cause of its last failed attempt. None when the job is gone."""
    dynamodb = client("dynamodb")
    found: dict[int, dict[str, Any]] = {}
    kwargs: dict[str, Any] = {}
    wanted = set(shards)
    while True:
        page = dynamodb.query(
            TableName=table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :shards)",
            ExpressionAttributeValues={
                ":pk": {"S": stages_pk(job_id)},
                ":shards": {"S": stage_sk(stage_index) + SHARD_INFIX},
            },
            ProjectionExpression="shard_index, last_error, attempt, cumulative_backoff_sec, attempts_log",
            ConsistentRead=True,
            **kwargs,
        )
        for item in map(from_attributes, page["Items"]):
            if item.get("shard_index") in wanted:
                last = (item.get("attempts_log") or [{}])[-1]
                found[item["shard_index"]] = {
                    "shard": item["shard_index"],
                    "error_class": item.get("last_error") or last.get("error"),
                    "attempts": item.get("attempt"),
                    "cumulative_backoff_sec": item.get("cumulative_backoff_sec"),
                    "cause": last.get("cause"),
                }
        if "LastEvaluatedKey" not in page:
            return found
        kwargs = {"ExclusiveStartKey": page["LastEvaluatedKey"]}
