"""The queue page (GET /queue): the queued jobs with their waits and buttons, and the agents."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from relevo_cli.console import actions
from relevo_cli.console.state import Console


def _waited_sec(since: str | None, now: datetime) -> int | None:
    if not since:
        return None
    return max(0, int((now - datetime.fromisoformat(since)).total_seconds()))


def queue_context(console: Console, view: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The queue as the API lists it, each job with its wait and its buttons' states."""
    caller = console.caller_arn()
    level_on = actions.project_levels(console.api, caller)
    rows = []
    for job in view["jobs"]:
        level = level_on(job["project"])
        buttons = [
            (action, actions.button_state(action, job, caller, level))
            for action in (actions.BY_NAME["promote"], actions.SET_PRIORITY, actions.BY_NAME["cancel"])
        ]
        rows.append({"job": job, "waited_sec": _waited_sec(job.get("created_at"), now), "buttons": buttons})
    waits = [row["waited_sec"] for row in rows if row["waited_sec"] is not None]
    return {
        "rows": rows,
        "oldest_wait_sec": max(waits, default=None),
        "agents": view["agents"],
        "waiting_for_agent": view.get("waiting_for_agent", []),
        "truncated": view["truncated"],
    }
