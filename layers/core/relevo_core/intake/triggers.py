"""Operator and API triggers: run a project now, re-run a job, release a held job."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from relevo_core.config import IntakeSettings
from relevo_core.execution import start_job_execution
from relevo_core.intake.enqueue import IntakeResult, enqueue
from relevo_core.models.envelope import Trigger, TriggerType, validation_error
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.requests import RerunRequest, RunRequest
from relevo_core.store import job_status, jobs
from relevo_core.store.projects import get_project

MANUAL_PRIORITY = 10


def _parse(model: type[BaseModel], body: Any) -> Any:
    try:
        return model.model_validate(body if body is not None else {})
    except ValidationError as exc:
        raise validation_error(exc) from exc


def run_project(settings: IntakeSettings, project_id: str, body: Any, actor: str) -> IntakeResult:
    request: RunRequest = _parse(RunRequest, body)
    project = get_project(settings.table_name, project_id)
    ref = request.ref or project.default_ref
    identity = request.commit or f"ref:{ref}"
    if request.request_id:
        identity = f"{identity}:request:{request.request_id}"
    trigger_type = TriggerType(request.trigger)
    priority = request.priority
    if priority is None and trigger_type is TriggerType.MANUAL:
        priority = MANUAL_PRIORITY
    return enqueue(
        settings,
        project,
        Trigger(
            type=trigger_type, source="cli" if trigger_type is TriggerType.MANUAL else "api", actor=actor
        ),
        ref=ref,
        commit=request.commit,
        identity=identity,
        stage_names=request.stages,
        priority=priority if priority is not None else 0,
    )


def rerun_job(settings: IntakeSettings, job_id: str, body: Any, actor: str) -> IntakeResult:
    """A new job (trigger=retry, retry_of) of the project's current configuration, for the same
    ref and commit, optionally from one stage on."""
    request: RerunRequest = _parse(RerunRequest, body)
    previous = jobs.get_envelope(settings.table_name, job_id)
    project = get_project(settings.table_name, previous.project)
    if request.from_stage is not None and request.from_stage not in {s.name for s in project.stages}:
        raise RelevoError(
            ErrorCode.STAGE_UNKNOWN, f"from_stage: {request.from_stage} is not a stage of {project.id}"
        )
    from relevo_core.jobs.handoff_sources import (
        require_handoffs_stored,
        resolved_commit,
    )  # reruns only: off the webhook's path

    if request.from_stage is not None:
        # What the skipped stages handed on must still be stored: refused now, not halfway.
        names = [stage.name for stage in project.stages]
        require_handoffs_stored(settings.table_name, job_id, names[: names.index(request.from_stage)])
    # The commit the job built, even when its trigger named only a ref: a rerun builds the same.
    commit = previous.commit or resolved_commit(settings.table_name, job_id)
    from relevo_core.store.build_numbers import job_build_number  # reruns only

    # And its build number, when it has one: the rerun's is the same (fleet/build_numbers).
    build_number = job_build_number(settings.table_name, job_id)
    return enqueue(
        settings,
        project,
        Trigger(type=TriggerType.RETRY, source="api", actor=actor),
        ref=previous.ref,
        commit=commit,
        identity=f"{previous.commit or previous.ref}:retry-of:{job_id}:{request.from_stage or ''}",
        priority=previous.priority,
        from_stage=request.from_stage,
        retry_of=job_id,
        build_number=build_number,
    )


def release_job(settings: IntakeSettings, job_id: str, actor: str) -> IntakeResult:
    """A held job (a pull request from a fork, or a repeat after its window) becomes queued and starts."""
    envelope = jobs.get_envelope(settings.table_name, job_id)
    job_status.release_held(settings.table_name, job_id, settings.queue_limit, actor, datetime.now(UTC))
    start_job_execution(settings, envelope)
    return IntakeResult(job_id, outcome="released")
