"""The Caches pages: the projects the caller may see (GET /caches), and one project's cache
entries in one region (GET /projects/{id}/caches): what GET /projects/{id}/caches answers, as
`relevo cache list` shows it (key, size, files, created, last used, hits, most recently used
first), the total against the project's limit, and whether the caller may delete an entry."""

from __future__ import annotations

from typing import Any

from relevo_cli.console import actions
from relevo_cli.console.state import Console


def projects_context(console: Console) -> dict[str, Any]:
    """The projects GET /projects shows the caller, each with its region (its caches' default)."""
    listed = sorted(console.api.list_projects()["projects"], key=lambda project: project["id"])
    return {"projects": listed}


def caches_context(console: Console, project_id: str, region: str | None) -> dict[str, Any]:
    """The project's entries in the region (the project's own when none is asked for), its total
    against max_total_bytes, the stack's regions to choose from, and why Delete is disabled."""
    listing = console.api.caches(project_id, region)
    caller = console.caller_arn()
    level = actions.caller_level(console.api, caller, project_id)
    why_not = actions.button_state(actions.DELETE_CACHE_ENTRY, {"project": project_id}, caller, level)
    regions = sorted({listing["region"], *(console.api.queue().get("regions") or ())})
    limit = listing["max_total_bytes"]
    return {
        "listing": listing,
        "regions": regions,
        "used_percent": round(100 * listing["total_bytes"] / limit, 1) if limit else None,
        "why_not": why_not,
    }
