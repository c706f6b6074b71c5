"""Pause, drain and resume (POST /agents/{agent_id}/pause|resume, /regions/{region}/pause|resume).

Who may: the stack's admin principals only. An agent belongs to no project (it runs the stages of
every project of its region), so no project grant can cover it; pausing one changes where every
project's stages run, which is the stack owner's call, like the stack's parameters.

What a pause does: the agent reads it with its presence tick and takes no new stage; the stages it
runs finish (their leases kept); a stage it would have taken stays on the queue for another online
agent of the region. A drain also has the agent exit once idle. The queue view and the job view say
`agent_paused` when every online agent of the region is paused, or the region's dispatch is.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from relevo_core.config.queue import QueueSettings
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.requests import PauseRequest
from relevo_core.projects.permissions import is_admin
from relevo_core.store.agent_pauses import AgentPause, delete_pause, put_pause
from relevo_core.store.agents import find_agent


def _require_admin(settings: QueueSettings, caller: str) -> None:
    if not is_admin(settings, caller):
        raise RelevoError(
            ErrorCode.FORBIDDEN,
            f"{caller} may not pause or resume agents: fleet operations need one of the stack's "
            "AdminPrincipals",
        )


def _known_region(settings: QueueSettings, region: str) -> str:
    if region not in settings.regions:
        raise RelevoError(
            ErrorCode.REGION_UNKNOWN,
            f"region affinity {region!r} is not one of this stack's {list(settings.regions)}",
        )
    return region


def _agent_region(settings: QueueSettings, agent_id: str, region: str | None) -> str:
    if region is not None:
        return _known_region(settings, region)
    found = find_agent(settings.table_name, settings.regions, agent_id)
    if found is None:
        raise RelevoError(
            ErrorCode.AGENT_NOT_FOUND,
            f"no agent {agent_id!r} has a presence record in {list(settings.regions)}; name its region to "
            "pause it before it starts",
        )
    return found.region


def _describe(pause: AgentPause) -> dict[str, Any]:
    return pause.model_dump(mode="json")


def pause_agent(
    settings: QueueSettings, agent_id: str, request: PauseRequest, caller: str, now: datetime
) -> dict[str, Any]:
    _require_admin(settings, caller)
    region = _agent_region(settings, agent_id, request.region)
    pause = AgentPause(
        region=region,
        agent_id=agent_id,
        note=request.note,
        drain=request.drain,
        set_at=now,
        until=now + timedelta(seconds=request.timeout_sec),
        timeout_sec=request.timeout_sec,
        set_by=caller,
    )
    put_pause(settings.table_name, pause)
    return {"paused": _describe(pause)}


def resume_agent(settings: QueueSettings, agent_id: str, region: str | None, caller: str) -> dict[str, Any]:
    _require_admin(settings, caller)
    region = _agent_region(settings, agent_id, region)
    ended = delete_pause(settings.table_name, region, agent_id)
    return {
        "agent_id": agent_id,
        "region": region,
        "resumed": ended is not None,
        "ended": _describe(ended) if ended else None,
    }


def pause_dispatch(
    settings: QueueSettings, region: str, request: PauseRequest, caller: str, now: datetime
) -> dict[str, Any]:
    _require_admin(settings, caller)
    if request.drain or request.region is not None:
        raise RelevoError(
            ErrorCode.VALIDATION_FAILED, "body: drain and region apply to an agent's pause, not a region's"
        )
    pause = AgentPause(
        region=_known_region(settings, region),
        note=request.note,
        set_at=now,
        until=now + timedelta(seconds=request.timeout_sec),
        timeout_sec=request.timeout_sec,
        set_by=caller,
    )
    put_pause(settings.table_name, pause)
    return {"paused": _describe(pause)}


def resume_dispatch(settings: QueueSettings, region: str, caller: str) -> dict[str, Any]:
    _require_admin(settings, caller)
    ended = delete_pause(settings.table_name, _known_region(settings, region), None)
    return {"region": region, "resumed": ended is not None, "ended": _describe(ended) if ended else None}
