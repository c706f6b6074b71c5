"""Access pattern: the task tokens the state machine keeps for a job (`TOKENS#{job}`), read by the
functions that answer them: the approve route (the approval gate's), the resolve route (a manual
review's) and the agents' outcome and heartbeat routes (an attempt's run token).

Only the state machine writes them (job.asl.json: AwaitApproval, AwaitResult, AwaitManualReview),
each in the transaction that makes the task wait; no job session can read the partition, and no
job session holds states:SendTask* at all (docs/architecture.md, "Trust boundaries").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes
from relevo_core.store.keys import APPROVAL_TOKEN_SK, key, review_token_sk, run_token_sk, tokens_pk


@dataclass(frozen=True)
class RunToken:
    """The token AwaitResult handed the claim of `agent_id`'s `attempt` (written only while that
    claim held the stage record)."""

    token: str
    agent_id: str
    attempt: int


@dataclass(frozen=True)
class ApprovalToken:
    token: str
    stage: str


@dataclass(frozen=True)
class ReviewToken:
    token: str
    attempt: int


def _get(table: str, job_id: str, sk: str) -> dict[str, Any]:
    item = (
        client("dynamodb")
        .get_item(TableName=table, Key=key(tokens_pk(job_id), sk), ConsistentRead=True)
        .get("Item")
    )
    return from_attributes(item or {})


def run_token(table: str, job_id: str, stage_index: int, shard: int | None = None) -> RunToken | None:
    item = _get(table, job_id, run_token_sk(stage_index, shard))
    if not item.get("token"):
        return None
    return RunToken(str(item["token"]), str(item.get("agent_id", "")), int(item.get("attempt", 0)))


def approval_token(table: str, job_id: str) -> ApprovalToken | None:
    item = _get(table, job_id, APPROVAL_TOKEN_SK)
    if not item.get("token"):
        return None
    return ApprovalToken(str(item["token"]), str(item.get("stage", "")))


def review_token(table: str, job_id: str, stage_index: int, shard: int | None = None) -> ReviewToken | None:
    item = _get(table, job_id, review_token_sk(stage_index, shard))
    if not item.get("token"):
        return None
    return ReviewToken(str(item["token"]), int(item.get("attempt", 0)))
