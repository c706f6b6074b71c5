"""Queue control: what is waiting and where it could run (`GET /queue`), moving a queued job in
line (promote, priority), and deleting an ended job with its logs and artifact records."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from relevo_core.config.queue import QueueSettings
from relevo_core.jobs.listing import list_jobs
from relevo_core.jobs.view import agent_queue_reason, job_items_to_view, no_match_detail, unclaimed_shards
from relevo_core.models.envelope import PRIORITY_BOUND, read_envelope
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.requests import JOB_LIST_MAX_LIMIT, JobListQuery, PriorityRequest
from relevo_core.models.status import JobStatus, QueueReason, StageStatus
from relevo_core.projects.permissions import is_admin, visibility
from relevo_core.store.agent_pauses import AgentPause, region_pauses
from relevo_core.store.agents import AgentPresence, agents_in_region
from relevo_core.store.audit import record_action
from relevo_core.store.codec import envelope_of
from relevo_core.store.job_purge import delete_job_children, delete_job_record
from relevo_core.store.job_status import StatusChanged
from relevo_core.store.jobs import get_job_record, query_job_items
from relevo_core.store.log_chunks import job_log_parts
from relevo_core.store.wait_order import set_priority

_ATTEMPTS = 5
_QUEUED = JobListQuery(status=JobStatus.QUEUED, limit=JOB_LIST_MAX_LIMIT)
_RUNNING = JobListQuery(status=JobStatus.RUNNING, limit=JOB_LIST_MAX_LIMIT)
ENDED_STATUSES = frozenset(status.value for status in JobStatus if status.terminal)


def _agent_row(
    agent: AgentPresence, now: datetime, stages: list[dict[str, Any]], pause: AgentPause | None
) -> dict[str, Any]:
    return {
        "agent_id": agent.agent_id,
        "region": agent.region,
        "used": agent.running,
        "capacity": agent.capacity,
        "version": agent.version,
        "last_seen": agent.last_seen.isoformat(),
        "online": agent.is_online(now),
        # The stages of viewable jobs this agent runs now (used counts every stage it runs).
        "running_stages": stages,
        # The operator's pause or drain while it lasts; what the agent itself says keeps it from claiming.
        "paused": pause.model_dump(mode="json") if pause is not None and pause.active(now) else None,
        "not_claiming": agent.not_claiming if agent.is_online(now) else None,
        "capabilities": agent.capabilities.model_dump(mode="json") if agent.capabilities else None,
    }


def _live_stages(table: str, can_view: Callable[[str], bool]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(job summary, stage view) of each stage of a running job that is on a queue or on an agent,
    and of each shard on a queue (`shard` set): a running job's records are read (one Query
    each), so this is bounded by the running jobs."""
    running = list_jobs(table, _RUNNING, can_view=can_view)["jobs"]
    live = []
    for job in running:
        items = query_job_items(table, job["job_id"])
        view = job_items_to_view(items)
        for stage in view["stages"]:
            if stage["status"] in (StageStatus.DISPATCHED.value, StageStatus.RUNNING.value):
                live.append((job, stage))
        for shard in unclaimed_shards(items, view):
            live.append(
                (
                    job,
                    {
                        "name": shard["stage"],
                        "shard": shard["shard"],
                        "status": StageStatus.DISPATCHED.value,
                        "attempt": shard["attempt"],
                        "dispatched_at": shard["dispatched_at"],
                        "requires": shard["requires"],
                    },
                )
            )
    return live


def caller_queue(settings: QueueSettings, caller: str, now: datetime) -> dict[str, Any]:
    """GET /queue: the queue as `caller` may see it (the projects it may view), the stack's region
    affinities (`regions`: a region no agent reported from is one too), and whether the caller may
    pause, drain and resume agents and regions (`fleet_manage`: one of the stack's admins)."""
    view = queue_view(settings.table_name, settings.regions, visibility(settings, caller).view, now)
    return {**view, "regions": list(settings.regions), "fleet_manage": is_admin(settings, caller)}


def queue_view(
    table: str, regions: tuple[str, ...], can_view: Callable[[str], bool], now: datetime
) -> dict[str, Any]:
    """Queued jobs of the projects the caller may view, in the order they will run (the
    `GET /jobs?status=queued` listing, positions counted among the rows shown); the running jobs
    whose stage, or shard of a stage (`shard`), waits on its region's queue for an agent
    (`waiting_for_agent`, with why:
    agent_offline, agent_busy, or none when a free agent is about to claim it); and every agent
    of the fleet's regions with its used / capacity, the stages it runs and whether it is online
    at `now`."""
    listing = list_jobs(table, _QUEUED, can_view=can_view)
    presence = {region: agents_in_region(table, region) for region in regions}
    pauses = {region: region_pauses(table, region) for region in regions}
    live = _live_stages(table, can_view)
    waiting = []
    for job, stage in live:
        if stage["status"] != StageStatus.DISPATCHED.value:
            continue
        region = job["region_affinity"]
        if region not in presence:
            presence[region], pauses[region] = agents_in_region(table, region), region_pauses(table, region)
        reason = agent_queue_reason(presence[region], now, pauses[region], stage["requires"])
        waiting.append(
            {
                **job,
                "stage": stage["name"],
                "shard": stage.get("shard"),
                "attempt": stage["attempt"],
                "dispatched_at": stage["dispatched_at"],
                "queue_reason": reason.value if reason else None,
                "requires": stage["requires"],
                "queue_detail": no_match_detail(stage["requires"], presence[region], now)
                if reason is QueueReason.NO_MATCHING_AGENT
                else None,
            }
        )
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for job, stage in live:
        if stage["status"] == StageStatus.RUNNING.value and stage["agent_id"]:
            by_agent.setdefault(stage["agent_id"], []).append(
                {
                    "job_id": job["job_id"],
                    "project": job["project"],
                    "stage": stage["name"],
                    "attempt": stage["attempt"],
                }
            )
    agents = [
        _agent_row(agent, now, by_agent.get(agent.agent_id, []), pauses[region].get(agent.agent_id))
        for region in regions
        for agent in presence[region]
    ]
    paused_regions = [
        pauses[region][None].model_dump(mode="json")
        for region in regions
        if None in pauses[region] and pauses[region][None].active(now)
    ]
    return {**listing, "waiting_for_agent": waiting, "agents": agents, "paused_regions": paused_regions}


def _change_priority(
    table: str, job_id: str, actor: str, now: datetime, action: str, choose: Callable[[dict[str, Any]], int]
) -> dict[str, Any]:
    """Set a queued job's priority to `choose(record)`, moving it in its project's waiting order
    (WaitOrderIndex) in the same write; read again when the job changed meanwhile."""
    for _ in range(_ATTEMPTS):
        record = get_job_record(table, job_id)
        if record["status"] != JobStatus.QUEUED.value:
            raise RelevoError(ErrorCode.JOB_NOT_QUEUED, f"job {job_id} is {record['status']}, not queued")
        previous, priority = int(record["priority"]), choose(record)
        try:
            set_priority(table, job_id, priority, actor, now)
        except StatusChanged:
            continue
        record_action(table, job_id, action, actor, now, priority=priority, previous_priority=previous)
        return {"job_id": job_id, "priority": priority, "previous_priority": previous}
    raise RelevoError(ErrorCode.JOB_NOT_QUEUED, f"job {job_id} kept changing; try again")


def set_job_priority(
    table: str, job_id: str, request: PriorityRequest, actor: str, now: datetime
) -> dict[str, Any]:
    return _change_priority(table, job_id, actor, now, "priority", lambda _record: request.priority)


def promote_job(table: str, job_id: str, actor: str, now: datetime) -> dict[str, Any]:
    """The job goes to the front of the queue: its priority becomes the highest priority among
    all queued jobs (of every project) + 1. Two promotes at the same instant may give the same
    priority; the earlier queue_seq then goes first."""

    def above_all(record: dict[str, Any]) -> int:
        queued = list_jobs(table, _QUEUED)["jobs"]
        highest = max([int(record["priority"])] + [int(job["priority"]) for job in queued])
        if highest >= PRIORITY_BOUND:
            raise RelevoError(
                ErrorCode.PRIORITY_OUT_OF_RANGE,
                f"a queued job already has the highest priority there is ({PRIORITY_BOUND})",
            )
        return highest + 1

    return _change_priority(table, job_id, actor, now, "promote", above_all)


def delete_job(table: str, job_id: str, actor: str, now: datetime) -> dict[str, Any]:
    """Delete an ended job: its stage records, log chunks and artifact records, then its record.

    This cannot be one transaction (a job may have thousands of log chunks), so it is made safe
    to repeat instead: the children go first (batch deletes, each harmless to repeat) and the job
    record last, conditional on the job still being ended. A crash part-way leaves the job
    visible and ended with some children gone; the next DELETE finds it, deletes what is left
    and then the record. The audit record is written first, so a deletion never lacks one.
    """
    record = get_job_record(table, job_id)
    status = JobStatus(record["status"])
    if not status.terminal:
        raise RelevoError(
            ErrorCode.JOB_NOT_ENDED,
            f"job {job_id} is {status.value}; only an ended job can be deleted (cancel it first)",
        )
    record_action(table, job_id, "delete", actor, now, status=status.value)
    removed = delete_job_children(table, job_id, job_log_parts(read_envelope(envelope_of(record))))
    delete_job_record(table, job_id, ENDED_STATUSES)
    return {"job_id": job_id, "deleted": True, "status": status.value, "removed": removed}
