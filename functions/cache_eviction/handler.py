"""Every 15 minutes: each project's caches kept within its cache_limits in every region of the
fleet: the least recently used entries past max_total_bytes and those unused for retention_days
evicted, then the packs and blobs no entry names removed (relevo_core.caches.eviction). A failure
raises and the next run comes: every step is a repeatable delete."""

from datetime import UTC, datetime

from relevo_core.caches.eviction import every_scope, evict_scopes
from relevo_core.config.cache_eviction import cache_eviction_settings
from relevo_core.observability import lambda_entry


@lambda_entry(correlation_id_path=None)
def lambda_handler(event, context):
    settings = cache_eviction_settings()
    scopes = every_scope(settings.table_name, settings.regions)
    results = evict_scopes(settings.table_name, settings.artifact_bucket, scopes, datetime.now(UTC))
    return {
        "scopes": [result.scope for result in results],
        "evicted": sum(len(result.evicted) for result in results),
        "objects_removed": sum(result.objects_removed for result in results),
    }
