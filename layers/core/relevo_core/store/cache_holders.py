"""Access pattern: which Macs recently saved or restored an entry of some of a project's caches in
one region (the `holders` store.cache_entries keeps on each entry), for the claim route's placement
(relevo_core.fleet.warm_macs).

One Query per cache name in the scope's partition, `begins_with(sk, KEY#<name>/)` (a stored key is
`<name>/<rendered key>`), projecting `holders` only: a project's entries are bounded by its cache's
size limit, so the pages are few, and each item read is a few names and times.
"""

from __future__ import annotations

from collections.abc import Iterable

from relevo_core.store.cache_entries import SK_PREFIX
from relevo_core.store.codec import to_attributes
from relevo_core.store.keys import cache_pk
from relevo_core.store.paging import query_items


def recent_holders(table: str, scope: str, names: Iterable[str]) -> dict[str, str]:
    """Each Mac that saved or restored an entry of the caches `names` in `scope`
    (`<project>/<region>`), with when it last did (an ISO time)."""
    latest: dict[str, str] = {}
    for name in dict.fromkeys(names):
        for item in query_items(
            TableName=table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues=to_attributes(
                {":pk": cache_pk(scope), ":prefix": f"{SK_PREFIX}{name}/"}
            ),
            ProjectionExpression="holders",
            Select="SPECIFIC_ATTRIBUTES",
        ):
            holders = item.get("holders")
            if not isinstance(holders, dict):
                continue
            for agent_id, when in holders.items():
                if isinstance(agent_id, str) and isinstance(when, str) and when > latest.get(agent_id, ""):
                    latest[agent_id] = when
    return latest
