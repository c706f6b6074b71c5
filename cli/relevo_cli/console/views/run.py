"""The run page (GET /run): the projects the caller may run, and starting one as
`relevo project run --again` does."""

from __future__ import annotations

import secrets
from typing import Any

from relevo_cli.api import RelevoApi
from relevo_cli.console import actions
from relevo_cli.console.state import Console


def run_context(console: Console, selected: str | None, group: str | None = None) -> dict[str, Any]:
    """The projects the caller may run (`operate`), those of `group` when one is chosen, and the
    selected one: the first left when the filter leaves the asked-for project out."""
    caller = console.caller_arn()
    runnable = []
    for project in sorted(console.api.list_projects()["projects"], key=lambda p: p["id"]):
        level = actions.caller_level(console.api, caller, project["id"])
        if level is not None and level.covers(actions.Level.OPERATE):
            runnable.append(project)
    groups = sorted({p["group"] for p in runnable if p.get("group")})
    shown = [p for p in runnable if p.get("group") == group] if group else runnable
    chosen = next((p for p in shown if p["id"] == selected), shown[0] if shown else None)
    return {
        "projects": shown,
        "project": chosen,
        "groups": groups,
        "group": group,
        "runnable": bool(runnable),
    }


def start_run(api: RelevoApi, project_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST /projects/{id}/run as `relevo project run --again` sends it, then where the job stands: its
    queue position while it is queued."""
    request = {
        "trigger": "manual",
        "request_id": secrets.token_hex(8),
        **{k: body[k] for k in ("ref", "stages", "priority") if body.get(k) not in (None, "", [])},
    }
    result = api.run_project(project_id, request)
    if result.get("outcome", "queued") == "queued" and not result.get("duplicate"):
        queued = next((job for job in api.queue()["jobs"] if job["job_id"] == result["job_id"]), None)
        result["queue_position"] = queued["queue_position"] if queued else None
    return result
