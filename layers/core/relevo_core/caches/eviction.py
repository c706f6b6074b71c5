"""A project's caches kept within its cache_limits in each region (docs/caches.md#limits).

Run by CacheEvictionFunction every 15 minutes (a schedule: the table stream's shard has its two
Lambda readers already), for every project that declares caches in every region of the fleet, so a
burst of saves is over the limit for at most that long. For one scope (`<project>/<region>`):

1. An entry neither saved nor restored for retention_days is evicted; then, while the entries'
   sizes total more than max_total_bytes, the least recently used one is (last_used_at, then
   created_at). An entry used within GRACE is never evicted: a restore moves last_used_at before it
   fetches a byte (store.cache_entries.touch), so an entry being restored stays whole. The record is
   deleted first, on the condition that last_used_at is still what was read (a restore that began
   meanwhile keeps it); a restore looks an entry up by its record, so once the record is gone no
   new restore starts on it. Then its manifest is deleted.
2. Packs and blobs no remaining entry's manifest names are deleted, and manifests no record names;
   only those older than GRACE: a save in progress uploads its objects before it records its
   entry. An entry whose manifest cannot be read (gone, or not its record's sha256) restores as a
   miss for ever (a key is written once): it is evicted too, so that a later job saves it again.

The bucket is versioned: a delete leaves a delete marker and the lifecycle rule's
NoncurrentVersionExpiration frees the bytes a day later. A failure raises and the whole run comes
again; every step is a repeatable delete.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from botocore.exceptions import ClientError
from pydantic import ValidationError

from relevo_core.aws import client, error_code
from relevo_core.models.cache import CacheEntry, CacheLimits, cache_prefix, entry_object
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.store import cache_entries
from relevo_core.store.cache_entries import CacheEntryRecord
from relevo_core.store.projects import get_project, list_projects

log = logging.getLogger("relevo_core.cache_eviction")

# How long an entry restored or saved, or an object stored, is left alone: longer than a restore
# or a save of the largest cache takes (10 GiB at 50 MB/s is under 4 minutes).
GRACE = timedelta(hours=1)

Reason = Literal["retention", "size", "unreadable"]


@dataclass(frozen=True)
class Evicted:
    key: str
    size: int
    last_used_at: str
    reason: Reason


@dataclass
class Eviction:
    scope: str
    limit: int
    total_before: int
    total_after: int = 0
    evicted: list[Evicted] = field(default_factory=list)
    # Entries over the limit that were used within GRACE (left for the next run).
    spared_in_use: int = 0
    objects_removed: int = 0


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _lru(record: CacheEntryRecord) -> tuple[str, str, str]:
    return (record.last_used_at, record.created_at, record.cache_key)


def _stored_objects(bucket: str, prefix: str) -> Iterator[dict[str, Any]]:
    pages = client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        yield from page.get("Contents", [])


def delete_cache_objects(bucket: str, keys: list[str]) -> None:
    """Objects under a cache prefix deleted, one DeleteObject each (a key already gone is no
    error). Not DeleteObjects: the local emulator refuses it to a role that holds s3:DeleteObject
    on the keys, which is all AWS asks (Amazon S3 API Reference, DeleteObjects, "Permissions")."""
    s3 = client("s3")
    for name in keys:
        s3.delete_object(Bucket=bucket, Key=name)


def _objects_of(bucket: str, prefix: str, record: CacheEntryRecord) -> set[str] | None:
    """The packs and blobs the entry's manifest names, relative to the prefix; None when the
    manifest cannot be read as its record says (the entry can only ever miss)."""
    name = f"{prefix}{entry_object(record.cache_key)}"
    try:
        data = client("s3").get_object(Bucket=bucket, Key=name)["Body"].read()
    except ClientError as exc:
        if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
            return None
        raise
    if hashlib.sha256(data).hexdigest() != record.manifest_sha256:
        return None
    try:
        entry = CacheEntry.model_validate(json.loads(data))
    except (ValueError, ValidationError):
        return None
    return {item.object for tree in entry.trees.values() for item in tree.files if item.object}


def _choose(
    records: list[CacheEntryRecord], unreadable: set[str], limits: CacheLimits, now: datetime
) -> tuple[list[tuple[CacheEntryRecord, Reason]], int]:
    """What to evict, oldest use first, and how many entries over the limit were spared in use."""
    in_use = now - GRACE
    expired_before = now - timedelta(days=limits.retention_days)
    chosen: list[tuple[CacheEntryRecord, Reason]] = []
    kept: list[CacheEntryRecord] = []
    for record in sorted(records, key=_lru):
        if _at(record.last_used_at) >= in_use:
            kept.append(record)
        elif record.cache_key in unreadable:
            chosen.append((record, "unreadable"))
        elif _at(record.last_used_at) < expired_before:
            chosen.append((record, "retention"))
        else:
            kept.append(record)
    total = sum(record.size for record in kept)
    spared = 0
    for record in list(kept):
        if total <= limits.max_total_bytes:
            break
        if _at(record.last_used_at) >= in_use:
            spared += 1
            continue
        chosen.append((record, "size"))
        kept.remove(record)
        total -= record.size
    return chosen, spared


def evict(table: str, bucket: str, project: str, region: str, limits: CacheLimits, now: datetime) -> Eviction:
    """Bring the project's caches in the region back within `limits` (see the module's text)."""
    scope, prefix = f"{project}/{region}", cache_prefix(project, region)
    records = cache_entries.list_entries(table, scope)
    objects = {record.cache_key: _objects_of(bucket, prefix, record) for record in records}
    unreadable = {key for key, named in objects.items() if named is None}
    result = Eviction(scope, limits.max_total_bytes, sum(record.size for record in records))
    chosen, result.spared_in_use = _choose(records, unreadable, limits, now)
    gone: set[str] = set()
    for record, reason in chosen:
        if not cache_entries.delete_entry(table, scope, record):
            continue  # restored since it was read: it stays, as used
        gone.add(record.cache_key)
        delete_cache_objects(bucket, [f"{prefix}{entry_object(record.cache_key)}"])
        result.evicted.append(Evicted(record.cache_key, record.size, record.last_used_at, reason))
        log.info(
            "cache %s: %s evicted (%s, %d bytes, last used %s)",
            scope,
            record.cache_key,
            reason,
            record.size,
            record.last_used_at,
        )
    remaining = [record for record in records if record.cache_key not in gone]
    result.total_after = sum(record.size for record in remaining)
    if result.spared_in_use:
        log.warning(
            "cache %s: %d bytes, over its limit of %d, with %d entr(ies) in use left for the next run",
            scope,
            result.total_after,
            limits.max_total_bytes,
            result.spared_in_use,
        )
    named = set().union(*(objects[record.cache_key] or set() for record in remaining))
    manifests = {entry_object(record.cache_key) for record in remaining}
    result.objects_removed = _remove_unnamed(bucket, prefix, named, manifests, now)
    return result


def _remove_unnamed(bucket: str, prefix: str, named: set[str], manifests: set[str], now: datetime) -> int:
    """Delete the scope's packs, blobs and manifests that nothing names, older than GRACE."""
    old_before = now - GRACE
    unnamed: list[str] = []
    for stored in _stored_objects(bucket, prefix):
        relative = stored["Key"][len(prefix) :]
        if stored["LastModified"] >= old_before:
            continue
        if relative.startswith("entries/"):
            if relative not in manifests:
                unnamed.append(stored["Key"])
        elif relative not in named:
            unnamed.append(stored["Key"])
    delete_cache_objects(bucket, unnamed)
    if unnamed:
        log.info("cache %s: %d object(s) no entry names removed", prefix, len(unnamed))
    return len(unnamed)


def evict_scopes(table: str, bucket: str, scopes: Iterable[tuple[str, str]], now: datetime) -> list[Eviction]:
    """Each (project, region) within its project's cache_limits; a project gone is left (logged)."""
    results: list[Eviction] = []
    limits_of: dict[str, CacheLimits | None] = {}
    for project, region in scopes:
        if project not in limits_of:
            try:
                limits_of[project] = get_project(table, project).cache_limits
            except RelevoError as exc:
                if exc.code is not ErrorCode.PROJECT_NOT_FOUND:
                    raise
                log.warning("cache %s/%s: its project is gone; its entries are left", project, region)
                limits_of[project] = None
        limits = limits_of[project]
        if limits is not None:
            results.append(evict(table, bucket, project, region, limits, now))
    return results


def every_scope(table: str, regions: Iterable[str]) -> list[tuple[str, str]]:
    """Every project that declares caches, in every region of the fleet."""
    return [(project.id, region) for project in list_projects(table) if project.caches for region in regions]
