"""The fleet page (GET /fleet): agents per region, each region's dispatch pause, and whether the
caller may pause, drain and resume."""

from __future__ import annotations

from typing import Any

# The fleet page's pause lengths (a pause ends by itself; the API allows up to 7 days).
FLEET_TIMEOUTS = (
    (300, "5 minutes"),
    (1800, "30 minutes"),
    (7200, "2 hours"),
    (86400, "1 day"),
    (7 * 86400, "7 days"),
)


def fleet_context(view: dict[str, Any], caller: str) -> dict[str, Any]:
    """GET /queue's agents per region affinity of the stack (a region no agent reported from, or
    whose dispatch is paused, is listed too), each region's dispatch pause, and whether the caller
    may pause, drain and resume (`fleet_manage`: the stack's admins; otherwise why not)."""
    agents = view["agents"]
    paused = {pause["region"]: pause for pause in view.get("paused_regions") or []}
    regions = sorted(set(view.get("regions") or ()) | {agent["region"] for agent in agents} | set(paused))
    manage = bool(view.get("fleet_manage"))
    why_not = (
        None
        if manage
        else (
            f"{caller} is not one of the stack's AdminPrincipals: pausing, draining and resuming "
            "agents changes where every project's stages run, so only they may"
        )
    )
    return {
        "regions": [(region, [a for a in agents if a["region"] == region]) for region in regions],
        "paused_regions": paused,
        "fleet_manage": manage,
        "why_not": why_not,
        "timeouts": FLEET_TIMEOUTS,
    }
