"""The job list (GET /): the jobs the API lists for the filters, each with its buttons' states."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from relevo_cli.console import actions
from relevo_cli.console.state import Console
from relevo_cli.console.summary import seconds_between

# GET /jobs query parameters the job list's filters map to, one each.
JOB_FILTERS = ("q", "project", "group", "agent", "status", "trigger", "since", "until")


def job_list_context(console: Console, filters: dict[str, str | None]) -> dict[str, Any]:
    """The jobs the API lists for these filters, each with its buttons' states, and the groups
    and projects the filters offer."""
    listed = console.api.list_jobs(**filters)
    projects = console.api.list_projects()["projects"]
    plans = {p["id"]: [stage["name"] for stage in p.get("stages") or []] for p in projects}
    caller = console.caller_arn()
    level_on = actions.project_levels(console.api, caller)
    now = datetime.now(UTC)
    rows = [
        {
            "job": job,
            "buttons": actions.row_buttons(
                job, caller, level_on(job["project"]), plans.get(job["project"], [])
            ),
            "duration_sec": seconds_between(job.get("started_at"), job.get("ended_at"), now),
        }
        for job in listed["jobs"]
    ]
    return {
        "rows": rows,
        "truncated": listed["truncated"],
        "filters": filters,
        "groups": sorted({p["group"] for p in projects if p.get("group")}),
        "projects": sorted(plans),
    }
