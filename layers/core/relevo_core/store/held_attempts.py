"""Access pattern: the stage attempts an agent claimed and never finished (HeldAttemptsIndex)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relevo_core.store.keys import HELD_ATTEMPTS_INDEX, stages_pk
from relevo_core.store.paging import query_items


@dataclass(frozen=True)
class HeldAttempt:
    """A stage attempt an agent claimed and has not finished (one entry of the held_by index)."""

    job_id: str
    stage_index: int
    stage_name: str
    attempt: int
    # The journal the claim came from (None when it named none).
    journal_id: str | None

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> HeldAttempt:
        return cls(
            job_id=str(item["pk"]).removeprefix(stages_pk("")),
            stage_index=int(item["stage_index"]),
            stage_name=str(item.get("stage_name", "")),
            attempt=int(item["attempt"]),
            journal_id=item.get("journal_id") or None,
        )


def held_by(table: str, agent_id: str) -> list[HeldAttempt]:
    """The stage attempts `agent_id` claimed and never finished (a sparse index: the claim sets
    `held_by`, the fenced finish removes it). What a restarting agent compares with its journal."""
    items = query_items(
        TableName=table,
        IndexName=HELD_ATTEMPTS_INDEX,
        KeyConditionExpression="held_by = :agent",
        # What HeldAttempt reads: a GSI returns only what it projects (template.yaml).
        ProjectionExpression="pk, attempt, journal_id, stage_index, stage_name",
        ExpressionAttributeValues={":agent": {"S": agent_id}},
    )
    return [HeldAttempt.from_item(item) for item in items]
