"""Table change stream → the projects' running artifact totals, and artifact.max_total_bytes
enforced on them: the oldest ended jobs' artifacts are removed until each project is back within
its bound. A failure raises, and the whole batch comes again: counting is once per stream record,
removal once per artifact, so a repeat changes nothing that was done."""

from datetime import UTC, datetime

from relevo_core.config import table_settings
from relevo_core.jobs.artifact_quota import handle_changes
from relevo_core.observability import lambda_entry


@lambda_entry(correlation_id_path=None)
def lambda_handler(event, context):
    results = handle_changes(table_settings().table_name, event.get("Records") or [], datetime.now(UTC))
    return {
        "removed": sum(len(result.removed) for result in results),
        "projects": [result.project for result in results],
    }
