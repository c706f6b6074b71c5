"""GET /projects/{id}/caches, GET and DELETE /projects/{id}/caches/entry: a project's cache entries
in one region as the table holds them (key, size, files, created, last used, hits, who saved it),
and one entry deleted by a person (its record, then its manifest; the packs and blobs only it named
go with CacheEvictionFunction's next run). The caller was checked for the route's level."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from relevo_core.aws import client
from relevo_core.caches.eviction import delete_cache_objects
from relevo_core.models.cache import MAX_KEY_CHARS, cache_prefix, cache_scope, entry_object
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.shapes import REGION_AFFINITY
from relevo_core.store import cache_entries
from relevo_core.store.projects import get_project


def _region(table: str, project_id: str, region: str | None) -> str:
    """The region asked for, or the project's own (region_affinity); the project must exist."""
    project = get_project(table, project_id)
    chosen = region or project.region_affinity
    if not re.fullmatch(REGION_AFFINITY, chosen):
        raise RelevoError(ErrorCode.QUERY_INVALID, f"region {chosen!r} is not a region affinity")
    return chosen


def _checked_key(cache_key: str | None) -> str:
    if not cache_key or len(cache_key) > MAX_KEY_CHARS:
        raise RelevoError(
            ErrorCode.QUERY_INVALID, f"key: give the entry's key (1 to {MAX_KEY_CHARS} characters)"
        )
    return cache_key


def list_caches(table: str, project_id: str, region: str | None) -> dict[str, Any]:
    chosen = _region(table, project_id, region)
    limits = get_project(table, project_id).cache_limits
    entries = sorted(
        cache_entries.list_entries(table, cache_scope(project_id, chosen)),
        key=lambda record: record.last_used_at,
        reverse=True,
    )
    return {
        "project": project_id,
        "region": chosen,
        "max_total_bytes": limits.max_total_bytes,
        "retention_days": limits.retention_days,
        "total_bytes": sum(record.size for record in entries),
        "count": len(entries),
        "entries": [asdict(record) for record in entries],
    }


def show_cache(table: str, project_id: str, region: str | None, cache_key: str | None) -> dict[str, Any]:
    chosen, wanted = _region(table, project_id, region), _checked_key(cache_key)
    record = cache_entries.get_entry(table, cache_scope(project_id, chosen), wanted)
    if record is None:
        raise RelevoError(
            ErrorCode.CACHE_ENTRY_NOT_FOUND, f"project {project_id} has no cache entry {wanted!r} in {chosen}"
        )
    return {"project": project_id, "region": chosen, **asdict(record)}


def delete_cache(
    table: str, bucket: str, project_id: str, region: str | None, cache_key: str | None
) -> dict[str, Any]:
    shown = show_cache(table, project_id, region, cache_key)
    chosen, wanted = shown["region"], shown["cache_key"]
    client("dynamodb").delete_item(
        TableName=table,
        Key=cache_entries.entry_key(cache_scope(project_id, chosen), wanted),
    )
    delete_cache_objects(bucket, [cache_prefix(project_id, chosen) + entry_object(wanted)])
    return {"project": project_id, "region": chosen, "deleted": wanted, "size": shown["size"]}
