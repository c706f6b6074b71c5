"""Access pattern: pauses of the fleet, in each region's pause partition (PAUSES#{region}).

An agent's pause (`PAUSE#{agent_id}`) keeps it from taking new stages; a drain also has it exit
once idle. The region's dispatch pause (`DISPATCH_PAUSE`) keeps every agent of the region from
taking new stages. Written by operators (the queue function), only read by the agents with their
presence tick (`pauses_for_agent`: its own item and its region's, one BatchGetItem) and by the
queue view (`region_pauses`: one Query). A pause ends at `until` (wall clock, stored) or at
resume (the item deleted); the agent also ends it `timeout_sec` after it first saw it, on its own
monotonic clock (relevo_agent.pause), so a Mac's wrong wall clock cannot stretch it. The item
expires through the table's TTL a day after `until`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.keys import DISPATCH_PAUSE_SK, key, pause_sk, pauses_pk
from relevo_core.store.paging import query_items

PAUSE_TTL_AFTER_SEC = 24 * 3600


class AgentPause(BaseModel):
    """A pause as an operator set it. `agent_id` None: the region's dispatch pause."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    region: str = Field(min_length=1)
    agent_id: str | None = None
    note: str = ""
    drain: bool = False
    set_at: datetime
    until: datetime
    timeout_sec: int = Field(ge=1)
    set_by: str = ""

    def active(self, now: datetime) -> bool:
        return now < self.until

    @property
    def pause_id(self) -> str:
        """Tells one pause from the next of the same agent (a new pause restarts its clock)."""
        return self.set_at.isoformat()


def _sk(agent_id: str | None) -> str:
    return DISPATCH_PAUSE_SK if agent_id is None else pause_sk(agent_id)


def put_pause(table: str, pause: AgentPause) -> None:
    """Set (or replace) the pause: the latest one wins."""
    item = {
        "pk": pauses_pk(pause.region),
        "sk": _sk(pause.agent_id),
        **pause.model_dump(mode="json", exclude_none=True),
        "ttl": int((pause.until + timedelta(seconds=PAUSE_TTL_AFTER_SEC)).timestamp()),
    }
    client("dynamodb").put_item(TableName=table, Item=to_attributes(item))


def delete_pause(table: str, region: str, agent_id: str | None) -> AgentPause | None:
    """Resume: the pause removed; the one that was there, if any."""
    old = (
        client("dynamodb")
        .delete_item(TableName=table, Key=key(pauses_pk(region), _sk(agent_id)), ReturnValues="ALL_OLD")
        .get("Attributes")
    )
    return AgentPause.model_validate(from_attributes(old)) if old else None


def pauses_for_agent(table: str, region: str, agent_id: str) -> tuple[AgentPause | None, AgentPause | None]:
    """(the agent's own pause, its region's dispatch pause), read strongly consistent in one call:
    only these two items of the partition."""
    keys = [key(pauses_pk(region), pause_sk(agent_id)), key(pauses_pk(region), DISPATCH_PAUSE_SK)]
    request: dict[str, Any] = {table: {"Keys": keys, "ConsistentRead": True}}
    found: list[dict[str, Any]] = []
    for _ in range(5):  # UnprocessedKeys: two small items are all but never left, but retry them
        answer = client("dynamodb").batch_get_item(RequestItems=request)
        found.extend(from_attributes(item) for item in answer.get("Responses", {}).get(table, []))
        request = answer.get("UnprocessedKeys") or {}
        if not request:
            break
    by_sk = {item["sk"]: AgentPause.model_validate(item) for item in found}
    return by_sk.get(pause_sk(agent_id)), by_sk.get(DISPATCH_PAUSE_SK)


def region_pauses(table: str, region: str) -> dict[str | None, AgentPause]:
    """Every pause of the region by agent id (None: the dispatch pause), expired ones included:
    one Query over the partition's PAUSE sort keys."""
    items = query_items(
        TableName=table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :pause)",
        ExpressionAttributeValues={":pk": {"S": pauses_pk(region)}, ":pause": {"S": DISPATCH_PAUSE_SK}},
        ConsistentRead=True,
    )
    pauses = [AgentPause.model_validate(item) for item in items]
    return {pause.agent_id: pause for pause in pauses}
