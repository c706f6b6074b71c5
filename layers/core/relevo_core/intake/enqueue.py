"""Intake: every trigger becomes exactly one job per idempotency key, then one execution.

All five trigger types come through `enqueue`: webhook, api, manual, schedule and retry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from relevo_core.config import IntakeSettings
from relevo_core.execution import start_job_execution, work_queue_url
from relevo_core.intake.busy_projects import busy_projects

# Where intake's project cache lives; named here too for the callers that clear it beside enqueue.
from relevo_core.intake.project_cache import project_cache  # noqa: F401
from relevo_core.models.cache import ref_may_write
from relevo_core.models.envelope import JobEnvelope, Trigger, TriggerType, new_job_id
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.plan import StagePlan
from relevo_core.models.project import Project
from relevo_core.models.project_settings import OnRepeat
from relevo_core.models.status import HeldReason
from relevo_core.plan_limits import require_envelope_fits, require_stages_fit
from relevo_core.store import job_creation


@dataclass(frozen=True)
class IntakeResult:
    job_id: str
    duplicate: bool = False
    # How the answer came about: created, held, duplicate, replayed_delivery, skipped.
    outcome: str = "created"
    previous_job_id: str | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"job_id": self.job_id, "duplicate": self.duplicate}
        if self.outcome not in ("created", "duplicate"):
            body["outcome"] = self.outcome
        if self.previous_job_id:
            body["previous_job_id"] = self.previous_job_id
        return body


def artifact_set(stages: tuple[StagePlan, ...]) -> str:
    return hashlib.sha256(json.dumps([stage.name for stage in stages]).encode()).hexdigest()[:16]


def idempotency_key(project_id: str, identity: str, stages: tuple[StagePlan, ...]) -> str:
    """project + what is built (commit, or the trigger's own identity) + the artifact set."""
    return f"{project_id}:{identity}:{artifact_set(stages)}"


def select_stages(project: Project, names: list[str] | None) -> tuple[StagePlan, ...]:
    stages = project.frozen_stages()
    if not names:
        return stages
    known = {stage.name for stage in stages}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise RelevoError(
            ErrorCode.STAGE_UNKNOWN, f"stages: {', '.join(unknown)} not in project {project.id}"
        )
    wanted = set(names)
    return tuple(stage for stage in stages if stage.name in wanted)


def build_envelope(
    settings: IntakeSettings,
    project: Project,
    trigger: Trigger,
    ref: str,
    commit: str | None,
    stages: tuple[StagePlan, ...],
    key: str,
    now: datetime,
    priority: int | None = None,
    from_stage: str | None = None,
    retry_of: str | None = None,
    stands_on: str | None = None,
) -> JobEnvelope:
    job_id = new_job_id(now.timestamp())
    return JobEnvelope(
        job_id=job_id,
        idempotency_key=key,
        project=project.id,
        region_affinity=project.region_affinity,
        artifact_uri=f"s3://{settings.artifact_bucket}/{project.id}/{job_id}/",
        created_at=now,
        **settings.expiry(now),
        trigger=trigger,
        priority=project.priority if priority is None else priority,
        ref=ref,
        commit=commit,
        stages=stages,
        queue_timeout_sec=project.queue_timeout_sec,
        exec_timeout_sec=max(stage.exec_timeout_sec for stage in stages),
        lease_ttl_sec=project.lease_ttl_sec,
        approval=project.approval,
        from_stage=from_stage,
        retry_of=retry_of,
        workspace_cleanup=project.workspace_cleanup,
        artifact_max_job_bytes=project.artifact.max_job_bytes,
        signing=project.signing,
        checkout=project.checkout,
        stands_on=stands_on,
        build_number=project.build_number,
        cache_write=any(stage.caches for stage in stages)
        and ref_may_write(ref, project.default_ref, project.cache_write_refs),
    )


# Triggers no person asked for at that moment: refused while their idempotency key is frozen.
# A person's explicit run (manual, api, rerun, dlq redrive, release of a held job) still goes.
AUTOMATIC_TRIGGERS = frozenset({TriggerType.WEBHOOK, TriggerType.SCHEDULE})


def enqueue(
    settings: IntakeSettings,
    project: Project,
    trigger: Trigger,
    ref: str,
    commit: str | None,
    identity: str,
    stage_names: list[str] | None = None,
    priority: int | None = None,
    from_stage: str | None = None,
    retry_of: str | None = None,
    now: datetime | None = None,
    held_reason: HeldReason | None = None,
    delivery_record: Callable[[str, HeldReason | None], dict[str, Any]] | None = None,
    build_number: int | None = None,
) -> IntakeResult:
    """One trigger in; at most one job out. `identity` is what makes two triggers the same work
    (the commit for Git triggers, the schedule slot for timers, ...). With a `held_reason` (a pull
    request from a fork) the job is written `held` and only a person's release starts it.
    `delivery_record(job_id, held_reason)` is the Put of the record of the webhook delivery that
    asked for the job: it is written in the job's own transaction, so it costs no call and exists
    exactly when the job does (a duplicate's transaction is cancelled, record and all). A rerun
    carries the `build_number` of the job it retries (relevo_core.fleet.build_numbers)."""
    now = now or datetime.now(UTC)
    # Refused before anything is written: a project stored under other limits may hold a plan
    # its jobs' executions could not carry (relevo_core.plan_limits).
    require_stages_fit(project)
    stages = select_stages(project, stage_names)
    key = idempotency_key(project.id, identity, stages)
    stands_on = None
    names = [s.name for s in stages]
    if from_stage is not None and from_stage in names and names.index(from_stage) > 0 and retry_of:
        from relevo_core.jobs.lineage import last_successful_before  # reruns only: not on the webhook's path

        stands_on = last_successful_before(settings.table_name, retry_of, names, names.index(from_stage))
    envelope = build_envelope(
        settings, project, trigger, ref, commit, stages, key, now, priority, from_stage, retry_of, stands_on
    )
    require_envelope_fits(envelope)
    # A region with no work queue is refused before anything is written (cached per container:
    # the start below reads it again for free).
    work_queue_url(settings.work_queue_prefix, envelope.region_affinity)
    window, on_repeat = project.dedup_for(trigger.type.value)
    refuse_frozen = trigger.type in AUTOMATIC_TRIGGERS

    def also_write(held: HeldReason | None) -> list[dict[str, Any]]:
        return [delivery_record(envelope.job_id, held)] if delivery_record is not None else []

    outcome = job_creation.create_job_or_repeat(
        settings.table_name,
        envelope,
        window,
        settings.queue_limit,
        now,
        on_repeat,
        held_reason=held_reason,
        refuse_frozen=refuse_frozen,
        also_write=also_write,
        build_number=build_number,
        queue_first=busy_projects.seems_busy(settings.table_name, project.id),
    )
    if isinstance(outcome, job_creation.Created):
        if outcome.found_lock_taken:
            busy_projects.found_busy(settings.table_name, project.id, settings.busy_project_memory_sec)
        elif outcome.took_lock:
            busy_projects.found_free(settings.table_name, project.id)
    if isinstance(outcome, job_creation.RepeatAfterWindow) and on_repeat is OnRepeat.SKIP:
        return IntakeResult(outcome.previous_job_id, duplicate=True, outcome="skipped")
    if isinstance(outcome, job_creation.Created) and outcome.held_reason is not None:
        return IntakeResult(envelope.job_id, outcome="held")
    if isinstance(outcome, job_creation.Duplicate):
        return IntakeResult(
            outcome.job_id,
            duplicate=True,
            outcome="replayed_delivery" if outcome.matched == "delivery" else "duplicate",
        )
    if isinstance(outcome, job_creation.QueueFull):
        raise RelevoError(
            ErrorCode.QUEUE_FULL,
            f"{outcome.queued} jobs are queued, the limit is {outcome.limit}; nothing was written",
        )
    if isinstance(outcome, job_creation.KeyFrozen):
        raise RelevoError(
            ErrorCode.KEY_FROZEN,
            f"idempotency key {outcome.idempotency_key} is frozen after repeated dead-lettering; "
            f"automatic runs are refused until `relevo dlq unfreeze` lifts it",
            idempotency_key=outcome.idempotency_key,
        )
    if isinstance(outcome, job_creation.RepeatAfterWindow):  # taken over by a concurrent repeat
        return IntakeResult(outcome.previous_job_id, duplicate=True)
    start_job_execution(settings, envelope, outcome.took_lock)
    return IntakeResult(envelope.job_id)
