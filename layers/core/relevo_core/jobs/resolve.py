"""Manual review, from the operator's side: finish a stage that reconciliation could not decide
(`relevo job resolve ID --stage S --as succeeded|retry|failed`). The resolution is recorded on
the stage and in the audit trail; Step Functions, answered through the token the stage keeps,
decides what it means."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from relevo_core.config import TableSettings
from relevo_core.execution import TaskGone, fail_task, succeed_task
from relevo_core.models.envelope import validation_error
from relevo_core.models.errors import ErrorClass, ErrorCode, RelevoError
from relevo_core.models.requests import Resolution
from relevo_core.models.status import StageStatus
from relevo_core.store import jobs, reviews
from relevo_core.store.audit import record_action


def resolve_stage(settings: TableSettings, job_id: str, stage: str, body: Any, actor: str) -> dict[str, Any]:
    try:
        resolution = Resolution.model_validate(body or {})
    except ValidationError as exc:
        raise validation_error(exc) from exc
    if resolution.as_ == "failed" and not resolution.reason:
        raise RelevoError(ErrorCode.VALIDATION_FAILED, "reason: resolving as failed needs a reason")
    names = [planned.name for planned in jobs.get_envelope(settings.table_name, job_id).stages]
    if stage not in names:
        raise RelevoError(ErrorCode.STAGE_UNKNOWN, f"job {job_id} has no stage {stage!r}")
    index = names.index(stage)
    record = reviews.review(settings.table_name, job_id, index)
    token = record.get("review_token")
    if record.get("status") != StageStatus.MANUAL_REVIEW.value or not token:
        raise RelevoError(
            ErrorCode.STAGE_NOT_IN_REVIEW, f"stage {stage} of {job_id} is {record.get('status', 'pending')}, not in manual review"
        )
    now = datetime.now(timezone.utc)
    try:
        reviews.record_resolution(settings.table_name, job_id, index, token, resolution.as_, actor, resolution.reason, now)
    except reviews.NotInReview as exc:
        raise RelevoError(ErrorCode.STAGE_NOT_IN_REVIEW, f"stage {stage} of {job_id} was resolved meanwhile") from exc
    try:
        if resolution.as_ == "failed":
            fail_task(token, ErrorClass.RESOLVED_FAILED.value, f"{actor}: {resolution.reason}")
        else:
            succeed_task(token, {"resolution": resolution.as_, "actor": actor, "reason": resolution.reason})
    except TaskGone as exc:
        raise RelevoError(ErrorCode.STAGE_NOT_IN_REVIEW, f"job {job_id} no longer waits on stage {stage}") from exc
    record_action(
        settings.table_name, job_id, "stage.resolve", actor, now, stage=stage, resolution=resolution.as_, reason=resolution.reason,
        evidence=record.get("reconciled"),
    )
    return {"job_id": job_id, "stage": stage, "resolution": resolution.as_, "actor": actor}
