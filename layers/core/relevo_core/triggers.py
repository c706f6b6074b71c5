"""Operator and API triggers: run a project now, re-run a job, release a held job."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relevo_core.config import IntakeSettings
from relevo_core.intake import IntakeResult, enqueue, start_execution, work_queue_url
from relevo_core.models.envelope import STAGE_NAME, Trigger, TriggerType, validation_error
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.store import jobs
from relevo_core.store.projects import get_project

MANUAL_PRIORITY = 10


class RunRequest(BaseModel):
    """POST /projects/{id}/run"""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: str | None = Field(default=None, min_length=1, max_length=256)
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,64}$")
    stages: list[str] | None = Field(default=None, min_length=1, max_length=32)
    priority: int | None = Field(default=None, ge=-1_000_000, le=1_000_000)
    trigger: Literal["api", "manual"] = "api"
    # Two requests with the same request_id are the same request (a retried CLI call); a new
    # request_id asks for a new run even inside the dedup window.
    request_id: str | None = Field(default=None, min_length=1, max_length=128)


class RerunRequest(BaseModel):
    """POST /jobs/{id}/rerun"""

    model_config = ConfigDict(extra="forbid", frozen=True)

    from_stage: str | None = Field(default=None, pattern=STAGE_NAME)


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
        Trigger(type=trigger_type, source="cli" if trigger_type is TriggerType.MANUAL else "api", actor=actor),
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
        raise RelevoError(ErrorCode.STAGE_UNKNOWN, f"from_stage: {request.from_stage} is not a stage of {project.id}")
    return enqueue(
        settings,
        project,
        Trigger(type=TriggerType.RETRY, source="api", actor=actor),
        ref=previous.ref,
        commit=previous.commit,
        identity=f"{previous.commit or previous.ref}:retry-of:{job_id}:{request.from_stage or ''}",
        priority=previous.priority,
        from_stage=request.from_stage,
        retry_of=job_id,
    )


def release_job(settings: IntakeSettings, job_id: str, actor: str) -> IntakeResult:
    """A held job (a pull request from a fork, or a repeat after its window) becomes queued and starts."""
    envelope = jobs.get_envelope(settings.table_name, job_id)
    jobs.release_held(settings.table_name, job_id, settings.queue_limit, actor, datetime.now(timezone.utc))
    start_execution(settings.state_machine_arn, envelope, work_queue_url(settings.work_queue_prefix, envelope.region_affinity))
    return IntakeResult(job_id, outcome="released")
