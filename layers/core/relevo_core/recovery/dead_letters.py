"""The dead-letter queue as an operator sees it: what failed, why, and resuming it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from relevo_core.config import AccessSettings, IntakeSettings, TableSettings
from relevo_core.execution import start_job_execution
from relevo_core.intake.enqueue import IntakeResult
from relevo_core.jobs.lineage import last_successful_before
from relevo_core.models.access import Level
from relevo_core.models.envelope import JobEnvelope, Trigger, TriggerType, new_job_id, read_envelope
from relevo_core.projects.permissions import require, visibility
from relevo_core.recovery.key_freeze import list_frozen_keys, project_of_key, unfreeze_key
from relevo_core.store import carried_shards, dead_letters, jobs, shard_failures
from relevo_core.store.codec import envelope_of
from relevo_core.store.keys import BUILD_NUMBER_ATTRIBUTE


def _json(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _summarized(table: str, job_id: str, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """A stage with shards that failed without fail_fast names its failed shards in a summary
    (job.asl.json: SummarizeShardFailures); each one's failure is on its own record. One detail a
    failed shard, from its record, or only what the summary says once the job's records are gone."""
    shards = [shard for shard in summary["failed_shards"] if isinstance(shard, int)]
    found = (
        shard_failures.shard_failures(table, job_id, summary.get("stage_index", -1), shards)
        if table and shards
        else {}
    )
    base = {"stage": summary.get("stage"), "stage_index": summary.get("stage_index")}
    return [
        {**base, **found[shard]}
        if shard in found
        else {
            **base,
            "shard": shard,
            "cause": "its record is gone (the job was deleted)",
            "error_class": summary.get("error_class") if shard == summary.get("first_failed_shard") else None,
        }
        for shard in shards
    ]


def _details(entry: dict[str, Any], table: str | None) -> list[dict[str, Any]]:
    """The failed stage's detail (stage, shard, class, attempts, backoff) when the cause carries
    it. A stage with shards and fail_fast false fails with a summary naming its failed shards
    (one detail each, read off their records); an entry written before the summary carries a list
    of its failed shards' failures ({Error, Cause}), each Cause such a detail."""
    cause = _json(entry.get("cause"))
    if isinstance(cause, dict) and isinstance(cause.get("failed_shards"), list):
        return _summarized(table or "", entry["job_id"], cause)
    if isinstance(cause, dict):
        return [cause]
    if isinstance(cause, list):
        details = [_json(failure.get("Cause")) for failure in cause if isinstance(failure, dict)]
        return [detail for detail in details if isinstance(detail, dict)]
    return []


def describe(entry: dict[str, Any], table: str | None = None) -> dict[str, Any]:
    """The entry as an operator reads it; `table` (where the failed job's records are) lets the
    failed shards of a stage that failed without fail_fast be read off their own records."""
    record = entry.get("job_record") or {}
    last_good = record.get("last_successful_stage")
    details = _details(entry, table)
    detail = details[0] if details else {}
    shard_details = sorted((d for d in details if isinstance(d.get("shard"), int)), key=lambda d: d["shard"])
    return {
        "job_id": entry["job_id"],
        "project": entry["project"],
        "state": entry["state"],
        "error": entry["error"],
        "failed_stage": detail.get("stage"),
        # A stage with shards: the shards that failed (with fail_fast, the one that stopped the others).
        "failed_shards": [d["shard"] for d in shard_details] or None,
        # What each failed shard left: its error class, attempts, backoff and cause, so that an
        # operator sees every shard's failure, not only the first.
        "shard_failures": [
            {
                "shard": d["shard"],
                "error_class": d.get("error_class"),
                "attempts": d.get("attempts"),
                "cumulative_backoff_sec": d.get("cumulative_backoff_sec"),
                "cause": d.get("cause"),
            }
            for d in shard_details
        ]
        or None,
        "attempts": detail.get("attempts"),
        "cumulative_backoff_sec": detail.get("cumulative_backoff_sec"),
        "cause": detail.get("cause", entry.get("cause")),
        "last_successful_stage": last_good.get("S") if isinstance(last_good, dict) else last_good,
        "failed_at": entry.get("failed_at"),
        "idempotency_key": entry.get("idempotency_key"),
        "redriven_as": entry.get("redriven_as"),
    }


def dead_letter_overview(access: AccessSettings, caller: str) -> dict[str, Any]:
    """GET /dlq: the entries and the frozen idempotency keys of the projects the caller may view,
    newest first."""
    can = visibility(access, caller)
    entries = [
        describe(entry, access.table_name)
        for entry in dead_letters.list_entries(access.table_name)
        if can.view(entry["project"])
    ]
    return {"entries": entries, "count": len(entries), "frozen_keys": list_frozen_keys(access, can.view)}


def unfreeze_dead_letter_key(access: AccessSettings, idempotency_key: str, actor: str) -> dict[str, Any]:
    """POST /dlq/keys/{key}/unfreeze: manage on the key's project lifts its freeze. Here, not in
    key_freeze, because the sweeper imports key_freeze and has no permission to check: the check
    (and the API plumbing it imports) stays out of the sweeper's cold start."""
    # The key names its project (project:identity:artifact-set).
    require(access, actor, project_of_key(idempotency_key), Level.MANAGE)
    return unfreeze_key(access, idempotency_key, actor)


def show_dead_letter(settings: TableSettings, job_id: str) -> dict[str, Any]:
    return describe(dead_letters.get_entry(settings.table_name, job_id), settings.table_name)


def _failed_envelope(table: str, raw_entry: dict[str, Any]) -> JobEnvelope:
    """The entry carries the job record as it was when the job failed, envelope included, so a
    redrive needs nothing else: it still resumes once the failed job itself was deleted."""
    carried = envelope_of(raw_entry.get("job_record") or {})
    return read_envelope(carried) if carried else jobs.get_envelope(table, raw_entry["job_id"])


def _build_number(table: str, job_id: str, raw_entry: dict[str, Any]) -> int | None:
    """The failed job's build number, which the job that resumes it keeps: the entry carries it
    (the job record as it was when it failed), else the job's record says it, if it got one."""
    from relevo_core.store.build_numbers import job_build_number

    carried = (raw_entry.get("job_record") or {}).get(BUILD_NUMBER_ATTRIBUTE)
    return int(carried) if carried is not None else job_build_number(table, job_id)


def redrive_dead_letter(settings: IntakeSettings, job_id: str, actor: str) -> IntakeResult:
    """Resume a dead-lettered job from its failed stage: its own frozen plan, the same
    idempotency key, a new job (trigger retry, retry_of) in its place."""
    raw = dead_letters.get_entry(settings.table_name, job_id)
    entry = describe(raw)
    failed = _failed_envelope(settings.table_name, raw)
    now = datetime.now(UTC)
    from relevo_core.jobs.handoff_sources import require_handoffs_stored, resolved_commit

    from_stage = entry["failed_stage"] or failed.from_stage
    names = [stage.name for stage in failed.stages]
    if from_stage in names:
        # What the skipped stages handed on must still be stored: refused now, not halfway.
        require_handoffs_stored(settings.table_name, job_id, names[: names.index(from_stage)])
    resumed = failed.model_copy(
        update={
            "job_id": new_job_id(now.timestamp()),
            "created_at": now,
            # A new job: retained from its own creation, not from the failed one's.
            **settings.expiry(now),
            "trigger": Trigger(type=TriggerType.RETRY, source="dlq", actor=actor),
            "from_stage": from_stage,
            "retry_of": job_id,
            # The commit the failed job built, also when only its first checkout knew it.
            "commit": failed.commit or resolved_commit(settings.table_name, job_id),
            "stands_on": last_successful_before(settings.table_name, job_id, names, names.index(from_stage))
            if from_stage in names
            else None,
        }
    )
    resumed = type(failed).model_validate(resumed.model_dump())
    # A stage with shards runs again only the shards that did not succeed: the others are carried
    # over as succeeded, so no shard's effect happens twice.
    index = names.index(from_stage) if from_stage in names else None
    succeeded = (
        carried_shards.succeeded_shards(settings.table_name, job_id, index)
        if index is not None and failed.stages[index].sharded
        else []
    )
    carried = carried_shards.carried_puts(
        settings.table_name, succeeded, job_id, resumed.job_id, resumed.ttl, actor, now
    )
    dead_letters.redrive(
        settings.table_name,
        job_id,
        resumed,
        settings.queue_limit,
        actor,
        now,
        carried,
        _build_number(settings.table_name, job_id, raw),
    )
    start_job_execution(settings, resumed)
    return IntakeResult(resumed.job_id, outcome="redriven", previous_job_id=job_id)
