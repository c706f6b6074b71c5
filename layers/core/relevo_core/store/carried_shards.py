"""Access pattern: the shards of a failed job's stage that succeeded, carried into the job a
dead-letter redrive resumes it as, so that the redrive runs only the shards that did not succeed.

Each shard is an operation of its own, with its effect once: a shard that succeeded is never
dispatched again. The carried record keeps the shard's key (`STAGE#nn#SHARD#kk`) under the new
job, says it succeeded and where (`carried_from`), and is closed (`closed_at`), so the new
execution's dispatch write for it is refused (job.asl.json: ShardMarkStageDispatched, its
condition SHARD_OPEN) and that shard's iteration passes without a message, and no claim can take
it (stage_claims.claim wants it open). Read with one Query of the failed job's stage partition
(`STAGES#<job>`, sort keys beginning `STAGE#nn#SHARD#`), consistent, before the redrive's
transaction writes anything.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from relevo_core.aws import client
from relevo_core.models.status import SUCCEEDED_STAGE
from relevo_core.store.codec import to_attribute
from relevo_core.store.keys import SHARD_INFIX, stage_sk, stages_pk

# What a carried record keeps of the shard's own: what it ran and what it left (its values, its
# receipt, its resolution), never what lets anyone act on it (tokens, dispatch key, lease, holder).
_CARRIED = (
    "status",
    "stage_name",
    "stage_index",
    "shard_index",
    "attempt",
    "agent_id",
    "started_at",
    "ended_at",
    "exit_code",
    "outcome",
    "receipt",
    "outputs",
    "handoff_stored",
    "checkout_commit",
    "retry_count",
    "cumulative_backoff_sec",
    "resolution",
)


def succeeded_shards(table: str, job_id: str, stage_index: int) -> list[dict[str, Any]]:
    """The records (DynamoDB JSON) of the shards of stage `stage_index` that succeeded in `job_id`
    (`succeeded` or `warning`), in shard order; none when the job is gone."""
    dynamodb = client("dynamodb")
    found: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {}
    while True:
        page = dynamodb.query(
            TableName=table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :shards)",
            ExpressionAttributeValues={
                ":pk": {"S": stages_pk(job_id)},
                ":shards": {"S": stage_sk(stage_index) + SHARD_INFIX},
            },
            ConsistentRead=True,
            **kwargs,
        )
        found += [item for item in page["Items"] if item.get("status", {}).get("S") in SUCCEEDED_STAGE]
        if "LastEvaluatedKey" not in page:
            return sorted(found, key=lambda item: item["sk"]["S"])
        kwargs = {"ExclusiveStartKey": page["LastEvaluatedKey"]}


def carried_puts(
    table: str,
    shards: list[dict[str, Any]],
    failed_job_id: str,
    new_job_id: str,
    ttl: int,
    actor: str,
    now: datetime,
) -> list[dict[str, Any]]:
    """The transaction items that write each carried shard under the new job: new records only
    (a redrive runs once), expiring with the new job. A shard carried twice (the redrive of a
    redrive) still names the job where it ran."""
    return [
        {
            "Put": {
                "TableName": table,
                "Item": {
                    **{name: shard[name] for name in _CARRIED if name in shard},
                    "pk": {"S": stages_pk(new_job_id)},
                    "sk": shard["sk"],
                    "carried_from": shard.get("carried_from", {"S": failed_job_id}),
                    "closed_at": to_attribute(now.isoformat()),
                    "last_writer": to_attribute(f"operator:{actor}"),
                    "ttl": {"N": str(ttl)},
                },
                "ConditionExpression": "attribute_not_exists(pk)",
            }
        }
        for shard in shards
    ]
