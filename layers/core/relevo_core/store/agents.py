"""Access pattern: agent presence, one record per agent under its region's partition.

Each relevo-agent puts its record every `interval_sec` (30 s by default) and marks it offline when
it stops cleanly. An agent is online while its record is not marked offline and its `last_seen`
is within ONLINE_MULTIPLE intervals of the reader's clock: one or two missed writes (a slow
network, a busy host) do not take it offline, a dead agent is offline within
ONLINE_MULTIPLE x interval. Records expire through the table's TTL a day after the last write.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from relevo_core.aws import client
from relevo_core.store.codec import to_attributes
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

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.running)

    def is_online(self, now: datetime) -> bool:
        return self.online and now - self.last_seen <= timedelta(seconds=ONLINE_MULTIPLE * self.interval_sec)


def put_presence(table: str, presence: AgentPresence) -> None:
    """The agent's record as of now; the latest write wins (only its own agent writes it)."""
    item = {
        "pk": agents_pk(presence.region),
        "sk": agent_sk(presence.agent_id),
        **presence.model_dump(mode="json"),
        "ttl": int(presence.last_seen.timestamp()) + PRESENCE_TTL_SEC,
    }
    client("dynamodb").put_item(TableName=table, Item=to_attributes(item))


def mark_offline(table: str, region: str, agent_id: str, now: datetime) -> None:
    """A clean stop: the agent is offline from now on, until its next presence write."""
    try:
        client("dynamodb").update_item(
            TableName=table,
            Key=key(agents_pk(region), agent_sk(agent_id)),
            UpdateExpression="SET #online = :false, running = :zero, last_seen = :now",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeNames={"#online": "online"},  # a DynamoDB reserved word
            ExpressionAttributeValues=to_attributes({":false": False, ":zero": 0, ":now": now.isoformat()}),
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
        # Never written (or already expired): there is nothing to mark.


def agents_in_region(table: str, region: str) -> list[AgentPresence]:
    """Every presence record of the region, online or not, in agent id order."""
    return [
        AgentPresence.model_validate(item)
        for item in query_items(
            TableName=table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": agents_pk(region)}},
            ConsistentRead=True,
        )
    ]


def online_agents(table: str, region: str, now: datetime) -> list[AgentPresence]:
    """The region's agents that are online at `now`, each with its capacity and free slots."""
    return [agent for agent in agents_in_region(table, region) if agent.is_online(now)]
