"""Access pattern: whether a region has any agent online, as a recorded change.

One item per region (AGENTS#{region} / ONLINE_AGENTS), written by the sweeper every minute only
when the region's state changed: "some agent online" → "none online" (every presence older than
its timeout, or marked offline), and back. The table's stream carries each write to the status
reporter, which pages agents_offline on the change to none, whether the last agent stopped
cleanly or was killed, froze or lost its network (it never wrote `online: false` then).

The write is one conditional UpdateItem (DynamoDB Developer Guide, "Condition expressions":
a failed condition writes nothing and answers ConditionalCheckFailedException): it happens only
while the stored state differs and was recorded by an earlier clock, so two sweeps that see the
same change write it once, and a sweep that read the fleet before a later one wrote cannot turn
the state back.
"""

from __future__ import annotations

from datetime import datetime

from relevo_core.store.codec import to_attributes
from relevo_core.store.conditional import update_if
from relevo_core.store.keys import REGION_ONLINE_SK, agents_pk, key


def record_region_online(table: str, region: str, online_agents: int, now: datetime) -> bool:
    """Record the region's state as of `now` (its count of online agents) when it changed since
    the last record; True when this call wrote it."""
    at = now.timestamp()
    return update_if(
        TableName=table,
        Key=key(agents_pk(region), REGION_ONLINE_SK),
        UpdateExpression="SET #online = :online, online_agents = :count, changed_at = :at",
        ConditionExpression="attribute_not_exists(pk) OR (#online <> :online AND changed_at < :at)",
        ExpressionAttributeNames={"#online": "online"},  # a DynamoDB reserved word
        ExpressionAttributeValues=to_attributes(
            {":online": online_agents > 0, ":count": online_agents, ":at": at}
        ),
    )
