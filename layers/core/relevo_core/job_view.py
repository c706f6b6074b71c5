"""A job as operators see it (GET /jobs/{id}, `relevo status`): its records, plus why a stage that
was dispatched is still waiting for an agent, derived from the region's agent presence, its
artifacts and the tail of its log."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable

from relevo_core.job_artifacts import artifact_summary
from relevo_core.job_logs import log_tail
from relevo_core.models.status import JobStatus, QueueReason, StageStatus
from relevo_core.store.artifacts import list_artifacts
from relevo_core.store.agents import AgentPresence, agents_in_region
from relevo_core.store.jobs import job_items_to_view, query_job_items


def agent_queue_reason(agents: Iterable[AgentPresence], now: datetime) -> QueueReason | None:
    """Why a dispatched stage is unclaimed: no agent of its region online (`agent_offline`), or
    every online agent at capacity (`agent_busy`). None when an online agent has a free slot:
    the stage is about to be claimed."""
    online = [agent for agent in agents if agent.is_online(now)]
    if not online:
        return QueueReason.AGENT_OFFLINE
    if all(agent.free == 0 for agent in online):
        return QueueReason.AGENT_BUSY
    return None


def show_job(table: str, job_id: str, now: datetime) -> dict[str, Any]:
    """The job view; `queue_reason` also says agent_busy / agent_offline while a stage of a live
    job is dispatched and unclaimed (a reason the state machine recorded, project_running, stays)."""
    view = job_items_to_view(query_job_items(table, job_id))
    unclaimed = any(stage["status"] == StageStatus.DISPATCHED.value for stage in view["stages"])
    if unclaimed and view["queue_reason"] is None and not JobStatus(view["status"]).terminal:
        reason = agent_queue_reason(agents_in_region(table, view["region_affinity"]), now)
        view["queue_reason"] = reason.value if reason else None
    view["artifacts"] = [artifact_summary(record) for record in list_artifacts(table, job_id)]
    # The last lines of the output, read back from the end of the log (never the whole log).
    view["log_tail"] = log_tail(table, job_id)
    return view
