"""`GET /jobs`: the jobs an operator asks for, filtered, newest first — or, for queued jobs,
in the order they will run."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from relevo_core.aws import in_this_context
from relevo_core.config import AccessSettings
from relevo_core.jobs.project_wait import with_project_waits
from relevo_core.models.plan import shard_count
from relevo_core.models.requests import JobListQuery
from relevo_core.models.status import SUCCEEDED_STAGE, JobStatus, StageStatus
from relevo_core.projects.permissions import visibility
from relevo_core.store.codec import envelope_of
from relevo_core.store.job_stages import stage_and_shard_records
from relevo_core.store.jobs import query_job_items
from relevo_core.store.jobs_by_status import jobs_with_status
from relevo_core.store.keys import BUILD_NUMBER_ATTRIBUTE, HELD_REASON_ATTRIBUTE
from relevo_core.store.project_jobs import jobs_of_project
from relevo_core.store.projects import list_projects


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _summary(record: dict[str, Any]) -> dict[str, Any]:
    envelope = envelope_of(record)
    trigger = envelope.get("trigger", {})
    plan = [stage.get("name") for stage in envelope.get("stages") or []]
    # A stage runs once, a stage with shards once a shard: the progress counts runs.
    runs = [shard_count(stage.get("parallel"), stage.get("matrix")) for stage in envelope.get("stages") or []]
    skipped = plan.index(envelope["from_stage"]) if envelope.get("from_stage") in plan else 0
    return {
        "job_id": record["job_id"],
        "project": record["project"],
        "status": record["status"],
        "trigger": trigger.get("type"),
        "trigger_source": trigger.get("source"),
        "ref": envelope.get("ref"),
        "commit": envelope.get("commit"),
        # trigger: the trigger named it; checkout: the job's first checkout resolved its ref (with_stages).
        "commit_source": "trigger" if envelope.get("commit") else None,
        "region_affinity": envelope.get("region_affinity"),
        "priority": int(record.get("priority", envelope.get("priority", 0))),
        "queue_seq": record.get("queue_seq"),
        "created_at": record.get("created_at"),
        "ended_at": record.get("ended_at"),
        "last_successful_stage": record.get("last_successful_stage"),
        "build_number": record.get(BUILD_NUMBER_ATTRIBUTE),
        "queue_reason": record.get("queue_reason"),
        "held_reason": record.get(HELD_REASON_ATTRIBUTE),
        "last_writer": record.get("last_writer"),
        "stages_total": len(plan),
        "runs_total": sum(runs),
        # Stages before from_stage are not run again: they count as done (a rerun stands on them).
        "stages_skipped": skipped,
        "runs_skipped": sum(runs[:skipped]),
        # Their runs are their shards' records (a matrix of one combination still runs as a shard).
        "sharded_stages": [
            stage.get("name")
            for stage in envelope.get("stages") or []
            if stage.get("parallel") is not None or stage.get("matrix") is not None
        ],
    }


_LIVE_STAGE = {
    StageStatus.DISPATCHED.value,
    StageStatus.RUNNING.value,
    StageStatus.RECONCILED.value,
    StageStatus.MANUAL_REVIEW.value,
}
_DONE_STAGE = SUCCEEDED_STAGE | {StageStatus.SKIPPED.value}
# Stage records of the listed jobs are read side by side (one Query each).
_STAGE_READERS = 8


def with_stages(table: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each listed job with what its stage records say (one Query of its STAGES# partition each,
    side by side): `stages_done` of `stages_total`, `runs_done` of `runs_total` (a shard is a run
    of its own), its `current_stage`, the `agents` that ran it in plan order, when its first stage
    `started_at`, and its `warning_stages`."""

    def stages_of(row: dict[str, Any]) -> Any:
        return stage_and_shard_records(table, row["job_id"])

    with ThreadPoolExecutor(max_workers=_STAGE_READERS) as pool:
        found = list(pool.map(in_this_context(stages_of), rows))
    for row, (stages, shards) in zip(rows, found, strict=True):
        sharded = set(row.pop("sharded_stages"))
        # A stage with shards ran where its shards did: its own record names no agent.
        attempts = sorted([*stages, *shards], key=lambda record: str(record["sk"]))
        agents: list[str] = []
        for record in attempts:
            if record.get("agent_id") and record["agent_id"] not in agents:
                agents.append(record["agent_id"])
        starts = [record["started_at"] for record in attempts if record.get("started_at")]
        runs_done = sum(
            1
            for stage in stages
            if stage.get("stage_name") not in sharded and stage.get("status") in _DONE_STAGE
        )
        row.update(
            {
                "runs_done": row.pop("runs_skipped")
                + runs_done
                + sum(1 for shard in shards if shard.get("status") in _DONE_STAGE),
                "stages_done": row.pop("stages_skipped")
                + sum(1 for stage in stages if stage.get("status") in _DONE_STAGE),
                "current_stage": next(
                    (stage.get("stage_name") for stage in stages if stage.get("status") in _LIVE_STAGE), None
                ),
                "agents": agents,
                "started_at": min(starts) if starts else None,
                "warning_stages": [
                    stage.get("stage_name")
                    for stage in stages
                    if stage.get("status") == StageStatus.WARNING.value
                ],
            }
        )
        if not row["commit"]:
            # A run without a commit builds the one its first checkout resolved (the job view's
            # JobContext.commit): the first recorded in plan order, a stage's or its shards'.
            resolved = next(
                (record["checkout_commit"] for record in attempts if record.get("checkout_commit")), None
            )
            row.update({"commit": resolved, "commit_source": "checkout" if resolved else None})
    return rows


def _keyword_fields(record: dict[str, Any]) -> tuple[str, ...]:
    envelope = envelope_of(record)
    trigger = envelope.get("trigger", {})
    fields = (
        record.get("job_id"),
        record.get("project"),
        envelope.get("ref"),
        envelope.get("commit"),
        trigger.get("source"),
        trigger.get("actor"),
        trigger.get("delivery_id"),
    )
    return tuple(str(value).lower() for value in fields if value)


def _matches(record: dict[str, Any], query: JobListQuery) -> bool:
    envelope = envelope_of(record)
    if query.q and not any(query.q.lower() in field for field in _keyword_fields(record)):
        return False
    if query.status and record.get("status") != query.status.value:
        return False
    if query.trigger and envelope.get("trigger", {}).get("type") != query.trigger.value:
        return False
    if query.region and envelope.get("region_affinity") != query.region:
        return False
    return True


def _ran_on(table: str, job_id: str, agent: str) -> bool:
    """Whether any attempt of the job's stages was claimed by `agent` (current or logged)."""
    for item in query_job_items(table, job_id):
        if not item["sk"].startswith("STAGE#"):
            continue
        if item.get("agent_id") == agent:
            return True
        # job.asl.json logs a failed attempt's agent as `agent` (RecordAttemptFailure).
        if any(entry.get("agent") == agent for entry in item.get("attempts_log", [])):
            return True
    return False


def queue_order_key(job: dict[str, Any]) -> tuple[int, str, str]:
    """Run order of queued jobs: higher priority first, then the earlier queue_seq (enqueue time
    where a job has none), then job id so the order is total."""
    seq = job.get("queue_seq")
    seq_key = (
        f"{int(seq):024d}"
        if isinstance(seq, (int, float)) or (isinstance(seq, str) and seq.isdigit())
        else ""
    )
    return (-int(job["priority"]), seq_key or str(job.get("created_at") or ""), job["job_id"])


def caller_jobs(access: AccessSettings, caller: str, query: JobListQuery) -> dict[str, Any]:
    """GET /jobs: the jobs matching `query` among the projects `caller` may view."""
    return list_jobs(access.table_name, query, can_view=visibility(access, caller).view, stage_progress=True)


def list_jobs(
    table: str,
    query: JobListQuery,
    can_view: Callable[[str], bool] = lambda _project: True,
    stage_progress: bool = False,
) -> dict[str, Any]:
    """Jobs matching `query` among the projects the caller may view; with `stage_progress`, each
    with what its stage records say (with_stages: one more Query per listed job).

    A live status (queued, running, waiting, …) is read from the JobStatusIndex, all of its jobs;
    queued jobs are then ordered as they will run. Otherwise the ProjectJobsIndex yields each
    project's jobs newest first, so each project contributes at most `limit` + 1 matches to a
    time-ordered page (the extra one tells whether there is more)."""
    queued_view = query.status is JobStatus.QUEUED
    found: list[dict[str, Any]] = []

    def take(record: dict[str, Any]) -> bool:
        if not _matches(record, query):
            return False
        if query.agent and not _ran_on(table, record["job_id"], query.agent):
            return False
        found.append(_summary(record))
        return True

    if query.status is not None and not query.status.terminal:
        # A live status: one query of the JobStatusIndex reads its jobs, of every project at
        # once, and never the ended jobs (which grow without bound). Live jobs are bounded by
        # the queue limit and the fleet, so all of them are read.
        in_group = {p.id for p in list_projects(table) if p.group == query.group} if query.group else None
        since, until = _iso(query.since), _iso(query.until)
        for record in jobs_with_status(table, query.status.value, query.project):
            project_id = record["project"]
            created = record.get("created_at") or ""
            if in_group is not None and project_id not in in_group:
                continue
            if (since and created < since) or (until and created > until) or not can_view(project_id):
                continue
            take(record)
    else:
        if query.group:
            # A group is a field of the registered projects: the ProjectJobsIndex is then
            # queried per project of the group, as for a project filter (no scan of the jobs).
            project_ids = [
                p.id for p in list_projects(table) if p.group == query.group and query.project in (None, p.id)
            ]
        else:
            project_ids = [query.project] if query.project else [p.id for p in list_projects(table)]
        for project_id in project_ids:
            if not can_view(project_id):
                continue
            taken = 0
            for record in jobs_of_project(table, project_id, _iso(query.since), _iso(query.until)):
                taken += take(record)
                if not queued_view and taken > query.limit:
                    break  # one more than a page: enough to say the listing is truncated
    if queued_view:
        found.sort(key=queue_order_key)
        for position, job in enumerate(found, start=1):
            job["queue_position"] = position
    else:
        found.sort(key=lambda job: (job.get("created_at") or "", job["job_id"]), reverse=True)
    # A job queued for its project: whether a job of the project runs, or waits at its approval gate.
    page = with_project_waits(table, found[: query.limit])
    if stage_progress:
        page = with_stages(table, page)
    else:
        for row in page:
            for name in ("stages_skipped", "runs_skipped", "sharded_stages"):
                row.pop(name)
    return {"jobs": page, "count": len(page), "truncated": len(found) > len(page)}
