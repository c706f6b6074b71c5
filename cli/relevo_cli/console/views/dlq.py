"""The dead-letter page (GET /dlq): entries to redrive and frozen keys to unfreeze, each with
why the caller may not, if they may not."""

from __future__ import annotations

from typing import Any

from relevo_cli.console import actions
from relevo_cli.console.state import Console


def dlq_context(console: Console) -> dict[str, Any]:
    caller = console.caller_arn()
    listing = console.api.dead_letters()
    levels: dict[str | None, Any] = {}

    def why_not(action: actions.Action, project: str | None) -> str | None:
        if project not in levels:
            levels[project] = actions.caller_level(console.api, caller, project) if project else None
        return actions.button_state(action, {"project": project or "?"}, caller, levels[project])

    entries = [{"entry": e, "why_not": why_not(actions.REDRIVE, e["project"])} for e in listing["entries"]]
    frozen = [
        {"key": k, "why_not": why_not(actions.UNFREEZE, k.get("project"))}
        for k in listing.get("frozen_keys") or []
    ]
    return {"entries": entries, "frozen": frozen}
