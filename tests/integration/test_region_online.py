"""The sweeper's record of a region's change to or from none online (store.region_online), on
the stack's table: written only on change, once however many sweeps see it, never turned back
by a sweep that read the fleet before the last change was recorded."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes
from relevo_core.store.region_online import record_region_online

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _record(table: str, region: str) -> dict:
    item = client("dynamodb").get_item(
        TableName=table, Key={"pk": {"S": f"AGENTS#{region}"}, "sk": {"S": "ONLINE_AGENTS"}}
    )["Item"]
    return from_attributes(item)


def test_a_region_change_is_written_once_and_a_stale_sweep_cannot_turn_it_back(local_stack):
    table, region = local_stack.table_name, "r-" + secrets.token_hex(3)
    minute = timedelta(minutes=1)
    assert record_region_online(table, region, 2, T0) is True  # the region's first record
    assert record_region_online(table, region, 1, T0 + minute) is False  # still some online: no change
    assert record_region_online(table, region, 0, T0 + 2 * minute) is True  # none online: the change
    assert (
        record_region_online(table, region, 0, T0 + 2 * minute) is False
    )  # a second sweep of the same minute
    assert record_region_online(table, region, 0, T0 + 3 * minute) is False
    # A sweep that counted before the change was recorded, and writes after it: refused.
    assert record_region_online(table, region, 1, T0 + minute + timedelta(seconds=30)) is False
    assert _record(table, region)["online"] is False
    assert (
        record_region_online(table, region, 1, T0 + 4 * minute) is True
    )  # back online: the next loss is a change again
    assert _record(table, region) == {
        "pk": f"AGENTS#{region}",
        "sk": "ONLINE_AGENTS",
        "online": True,
        "online_agents": 1,
        "changed_at": (T0 + 4 * minute).timestamp(),
    }
