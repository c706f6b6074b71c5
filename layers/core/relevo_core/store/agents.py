"""Access pattern: agent presence, one record per agent under its region's partition.

Each relevo-agent puts its record every `interval_sec` (30 s by default) and marks it offline when
it stops cleanly. An agent is online while its record is not marked offline and its `last_seen`
is within ONLINE_MULTIPLE intervals of the reader's clock: one or two missed writes (a slow
network, a busy host) do not take it offline, a dead agent is offline within
ONLINE_MULTIPLE x interval. Records expire through the table's TTL a day after the last write.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from relevo_core.aws import client, error_code
from relevo_core.models.capabilities import Capabilities
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.keys import agent_sk, agents_pk, key
from relevo_core.store.paging import query_items

# An agent counts as online while last_seen >= now - ONLINE_MULTIPLE * its own interval.
ONLINE_MULTIPLE = 3
# A presence record is deleted by TTL this long after its last write.
PRESENCE_TTL_SEC = 24 * 3600


class AgentPresence(BaseModel):
    """One agent as it last described itself."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    agent_id: str = Field(min_length=1, max_length=128)
    region: str = Field(min_length=1)
    capacity: int = Field(ge=1)
    running: int = Field(ge=0)
    version: str
    last_seen: datetime
    interval_sec: float = Field(gt=0)
    # False once the agent stopped cleanly: offline at once, not after ONLINE_MULTIPLE intervals.
    online: bool = True
    # Which relevo-agent process writes this record (one per agent_id at a time), where, since when.
    instance_id: str | None = None
    host: str | None = None
    started_at: datetime | None = None
    # Why the agent takes no new stage now, as it sees it (a QueueReason value: agent_paused,
    # agent_low_disk), or None while it claims.
    not_claiming: str | None = None
    # What it detected on its host and its TOML labels (stages' `requires` are matched to them).
    capabilities: Capabilities | None = None
    # The stage of each shard it holds, `<job>:<stage>` once a shard: shards of one stage spread
    # over the region's Macs by it (relevo_agent.presence).
    shard_stages: tuple[str, ...] = ()

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.running)

    def shards_of(self, stage: str) -> int:
        """How many shards of `stage` (`<job>:<stage>`) it holds."""
        return self.shard_stages.count(stage)

    def is_online(self, now: datetime) -> bool:
        return self.online and now - self.last_seen <= timedelta(seconds=ONLINE_MULTIPLE * self.interval_sec)


class AgentIdInUse(Exception):
    """Another relevo-agent process has this agent_id: `other` is its presence record."""

    def __init__(self, other: AgentPresence) -> None:
        self.other = other
        seen = other.last_seen.isoformat(timespec="seconds")
        started = other.started_at.isoformat(timespec="seconds") if other.started_at else "an unknown time"
        super().__init__(
            f"agent_id {other.agent_id} is in use by another relevo-agent on host {other.host or '?'} "
            f"(instance {other.instance_id}, started {started}, last seen {seen})"
        )


def _item(presence: AgentPresence) -> dict[str, Any]:
    return {
        "pk": agents_pk(presence.region),
        "sk": agent_sk(presence.agent_id),
        **presence.model_dump(mode="json", exclude_none=True),
        "ttl": int(presence.last_seen.timestamp()) + PRESENCE_TTL_SEC,
    }


def take_agent_id(table: str, presence: AgentPresence, predecessor: str | None = None) -> None:
    """At an agent's start: its record now names this instance, unless another instance of the
    agent_id is online (AgentIdInUse). `predecessor` is the instance this agent's own journal
    last ran as: that one is this Mac's earlier process (killed, crashed, restarted by launchd),
    whose record still looks online, and is taken over at once. Read, then written on condition
    nobody wrote in between, so two agents starting together cannot both take it."""
    found = (
        client("dynamodb")
        .get_item(
            TableName=table,
            Key=key(agents_pk(presence.region), agent_sk(presence.agent_id)),
            ConsistentRead=True,
        )
        .get("Item")
    )
    condition, values = "attribute_not_exists(pk)", {}
    if found:
        other = AgentPresence.model_validate(from_attributes(found))
        if other.instance_id not in (None, presence.instance_id, predecessor) and other.is_online(
            presence.last_seen
        ):
            raise AgentIdInUse(other)
        condition, values = "last_seen = :seen", {":seen": from_attributes(found)["last_seen"]}
    _put(table, presence, condition, values)


def put_presence(table: str, presence: AgentPresence) -> None:
    """The agent's record as of now, written only while it still names this instance (or no
    instance): a second process with the same agent_id cannot overwrite it (AgentIdInUse)."""
    condition = "attribute_not_exists(pk) OR attribute_not_exists(instance_id)"
    values: dict[str, Any] = {}
    if presence.instance_id:
        condition += " OR instance_id = :me"
        values[":me"] = presence.instance_id
    _put(table, presence, condition, values)


def _put(table: str, presence: AgentPresence, condition: str, values: dict[str, Any]) -> None:
    """The record, on `condition`; a refusal names the instance that holds the agent_id."""
    try:
        client("dynamodb").put_item(
            TableName=table,
            Item=to_attributes(_item(presence)),
            ConditionExpression=condition,
            **({"ExpressionAttributeValues": to_attributes(values)} if values else {}),
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except ClientError as exc:
        if error_code(exc) != "ConditionalCheckFailedException":
            raise
        # ReturnValuesOnConditionCheckFailure puts the record in the error response.
        found = from_attributes(exc.response.get("Item", {}))  # type: ignore[arg-type]  # stubs lack Item
        raise AgentIdInUse(AgentPresence.model_validate(found)) from exc


def mark_offline(
    table: str, region: str, agent_id: str, now: datetime, instance_id: str | None = None
) -> None:
    """A clean stop: the agent is offline from now on, until its next presence write. With an
    `instance_id`, only while the record still names that instance."""
    condition, values = "attribute_exists(pk)", {":false": False, ":zero": 0, ":now": now.isoformat()}
    if instance_id:
        condition += " AND instance_id = :me"
        values[":me"] = instance_id
    try:
        client("dynamodb").update_item(
            TableName=table,
            Key=key(agents_pk(region), agent_sk(agent_id)),
            UpdateExpression="SET #online = :false, running = :zero, last_seen = :now",
            ConditionExpression=condition,
            ExpressionAttributeNames={"#online": "online"},  # a DynamoDB reserved word
            ExpressionAttributeValues=to_attributes(values),
        )
    except ClientError as exc:
        if error_code(exc) != "ConditionalCheckFailedException":
            raise
        # Never written (or already expired), or another instance's now: nothing to mark.


def agents_in_region(table: str, region: str) -> list[AgentPresence]:
    """Every presence record of the region, online or not, in agent id order."""
    return [
        AgentPresence.model_validate(item)
        for item in query_items(
            TableName=table,
            # The partition also holds the region's pauses (relevo_core.store.agent_pauses).
            KeyConditionExpression="pk = :pk AND begins_with(sk, :agent)",
            ExpressionAttributeValues={":pk": {"S": agents_pk(region)}, ":agent": {"S": agent_sk("")}},
            ConsistentRead=True,
        )
    ]


def online_agents(table: str, region: str, now: datetime) -> list[AgentPresence]:
    """The region's agents that are online at `now`, each with its capacity and free slots."""
    return [agent for agent in agents_in_region(table, region) if agent.is_online(now)]


def find_agent(table: str, regions: tuple[str, ...], agent_id: str) -> AgentPresence | None:
    """The agent's presence record in the first of `regions` that has one (one GetItem each)."""
    for region in regions:
        found = (
            client("dynamodb")
            .get_item(TableName=table, Key=key(agents_pk(region), agent_sk(agent_id)), ConsistentRead=True)
            .get("Item")
        )
        if found:
            return AgentPresence.model_validate(from_attributes(found))
    return None
