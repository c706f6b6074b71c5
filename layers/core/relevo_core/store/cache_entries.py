"""Access pattern: a project's cache entries in one region (relevo_core.models.cache). One item
per key, `CACHE#<project>/<region>` / `KEY#<key>`, with what the entry holds (size, files, the
sha256 of its manifest, which job stored it) and how it is used (created_at, last_used_at, hits).

- An entry is written once: PutItem with `attribute_not_exists(pk)` (DynamoDB Developer Guide,
  "Condition expressions"); the loser of two saves of one key is refused and keeps nothing of its
  own (its blobs are content-addressed, the same bytes under the same names).
- A restore key is a prefix: the sort key is the key itself, so `begins_with(sk, KEY#<prefix>)`
  finds every entry it names in one partition, and the newest by created_at is kept (a project's
  entries are bounded by its cache's size limit, so the pages are few).
- A hit moves last_used_at and adds one to hits, and names its Mac in `holders`, nothing else (the
  job session's policy allows those three attributes only: template.yaml CountItsProjectsCacheHits).
- `holders`: the Macs (agent ids) that saved or restored the entry, each with when, at most
  MAX_HOLDERS (the oldest dropped): where its bytes likely sit in a Mac's content cache, which the
  claim route prefers (relevo_core.fleet.warm_macs, read by store.cache_holders). Not part of
  CacheEntryRecord: a placement hint, not what the entry is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.keys import cache_entry_sk, cache_pk, key
from relevo_core.store.paging import query_items

SK_PREFIX = "KEY#"
# The Macs an entry names as holding it: the most recent ones (a region's fleet is larger).
MAX_HOLDERS = 8


@dataclass(frozen=True)
class CacheEntryRecord:
    cache_key: str
    manifest_sha256: str
    # The bytes of the files it holds, and how many files.
    size: int
    files: int
    created_at: str
    job_id: str
    stage: str
    last_used_at: str
    hits: int = 0

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> CacheEntryRecord:
        return cls.from_values(from_attributes(item))

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> CacheEntryRecord:
        return cls(**{name: values[name] for name in cls.__dataclass_fields__ if name in values})


def entry_key(scope: str, cache_key: str) -> dict[str, dict[str, str]]:
    return key(cache_pk(scope), cache_entry_sk(cache_key))


def put_entry(table: str, scope: str, record: CacheEntryRecord, holder: str | None = None) -> bool:
    """The entry recorded (`holder`: the Mac that saved it); False when the key has one already
    (it is left as it is)."""
    values: dict[str, Any] = asdict(record)
    if holder:
        values["holders"] = {holder: record.created_at}
    try:
        client("dynamodb").put_item(
            TableName=table,
            Item={**key(cache_pk(scope), cache_entry_sk(record.cache_key)), **to_attributes(values)},
            ConditionExpression="attribute_not_exists(pk)",
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            return False
        raise
    return True


def get_entry(table: str, scope: str, cache_key: str) -> CacheEntryRecord | None:
    item = (
        client("dynamodb")
        .get_item(TableName=table, Key=key(cache_pk(scope), cache_entry_sk(cache_key)), ConsistentRead=True)
        .get("Item")
    )
    return CacheEntryRecord.from_item(item) if item else None


def newest_with_prefix(table: str, scope: str, prefix: str) -> CacheEntryRecord | None:
    """The newest entry whose key starts with `prefix` (created_at, then the key, decide)."""
    newest: CacheEntryRecord | None = None
    request: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
        "ExpressionAttributeValues": to_attributes({":pk": cache_pk(scope), ":prefix": SK_PREFIX + prefix}),
        "ConsistentRead": True,
    }
    while True:
        page = client("dynamodb").query(**request)
        for item in page.get("Items", []):
            record = CacheEntryRecord.from_item(item)
            if newest is None or (record.created_at, record.cache_key) > (
                newest.created_at,
                newest.cache_key,
            ):
                newest = record
        if "LastEvaluatedKey" not in page:
            return newest
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def count_hit(table: str, scope: str, cache_key: str, now: str, holder: str | None = None) -> None:
    """A restore of the entry: last_used_at and hits, and `holder` (the Mac that restored it) in
    its holders, the oldest dropped beyond MAX_HOLDERS (an entry gone meanwhile is left gone)."""
    entry = key(cache_pk(scope), cache_entry_sk(cache_key))
    if not holder:
        _update(table, entry, "SET last_used_at = :now ADD hits :one", {":now": now, ":one": 1})
        return
    names = {"#holder": holder}
    values = {":now": now, ":one": 1, ":max": MAX_HOLDERS}
    room = "attribute_not_exists(holders) OR attribute_exists(holders.#holder) OR size(holders) < :max"
    try:
        # A name already there, or room for one more: one write. size() of a map counts its
        # elements ("Condition and filter expressions", DynamoDB Developer Guide).
        _update(
            table,
            entry,
            "SET last_used_at = :now, holders.#holder = :now ADD hits :one",
            values,
            names,
            f" AND ({room})",
        )
        return
    except _Full:
        pass
    except ClientError as exc:
        # SET of a map's key needs the map (a document path to a missing map is a
        # ValidationException, "Update expressions", DynamoDB Developer Guide): an entry recorded
        # without holders. Nothing was written: the map is set whole.
        if error_code(exc) != "ValidationException":
            raise
        _set_holders(table, entry, now, {holder: now})
        return
    # Full (or gone): the oldest names make room, removed in the same write as the hit.
    item = (
        client("dynamodb")
        .get_item(TableName=table, Key=entry, ConsistentRead=True, ProjectionExpression="pk, holders")
        .get("Item")
    )
    if not item:
        return  # gone meanwhile
    holders = from_attributes(item).get("holders")
    if not isinstance(holders, dict):
        _set_holders(table, entry, now, {holder: now})
        return
    newest_first = sorted(holders, key=lambda name: (str(holders[name]), name), reverse=True)
    dropped = {f"#old{index}": name for index, name in enumerate(newest_first[MAX_HOLDERS - 1 :])}
    dropped = {alias: name for alias, name in dropped.items() if name != holder}
    remove = " REMOVE " + ", ".join(f"holders.{alias}" for alias in dropped) if dropped else ""
    _update(
        table,
        entry,
        "SET last_used_at = :now, holders.#holder = :now" + remove + " ADD hits :one",
        {":now": now, ":one": 1},
        {**names, **dropped},
    )


def _set_holders(table: str, entry: dict[str, Any], now: str, holders: dict[str, str]) -> None:
    _update(
        table,
        entry,
        "SET last_used_at = :now, holders = :holders ADD hits :one",
        {":now": now, ":one": 1, ":holders": holders},
    )


class _Full(Exception):
    """The hit's condition refused it: the entry's holders are full (or the entry is gone)."""


def _update(
    table: str,
    entry: dict[str, Any],
    update: str,
    values: dict[str, Any],
    names: dict[str, str] | None = None,
    condition: str = "",
) -> None:
    """An update of the entry, when it is there (gone meanwhile: left gone); _Full when
    `condition` is given and the update was refused."""
    try:
        client("dynamodb").update_item(
            TableName=table,
            Key=entry,
            UpdateExpression=update,
            ConditionExpression="attribute_exists(pk)" + condition,
            ExpressionAttributeValues=to_attributes(values),
            **({"ExpressionAttributeNames": names} if names else {}),
        )
    except ClientError as exc:
        if error_code(exc) != "ConditionalCheckFailedException":
            raise
        if condition:
            raise _Full from exc  # or gone: the read that follows tells


def touch(table: str, scope: str, cache_key: str, now: str) -> None:
    """A restore begins: last_used_at moved before a byte is fetched, so that eviction, which
    spares an entry used within its grace, leaves the entry alone while it is restored."""
    try:
        client("dynamodb").update_item(
            TableName=table,
            Key=key(cache_pk(scope), cache_entry_sk(cache_key)),
            UpdateExpression="SET last_used_at = :now",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues=to_attributes({":now": now}),
        )
    except ClientError as exc:
        if error_code(exc) != "ConditionalCheckFailedException":
            raise


def list_entries(table: str, scope: str) -> list[CacheEntryRecord]:
    """Every entry of the scope, in key order."""
    return [
        CacheEntryRecord.from_values(item)
        for item in query_items(
            TableName=table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues=to_attributes({":pk": cache_pk(scope), ":prefix": SK_PREFIX}),
            ConsistentRead=True,
        )
    ]


def delete_entry(table: str, scope: str, record: CacheEntryRecord) -> bool:
    """The entry's record deleted, unless it was used since `record` was read (its last_used_at
    moved: a restore began) or is gone already; False then."""
    try:
        client("dynamodb").delete_item(
            TableName=table,
            Key=key(cache_pk(scope), cache_entry_sk(record.cache_key)),
            ConditionExpression="last_used_at = :seen",
            ExpressionAttributeValues=to_attributes({":seen": record.last_used_at}),
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            return False
        raise
    return True
