"""Manual review, from the operator's side: finish a stage that reconciliation could not decide
(`relevo job resolve ID --stage S --as succeeded|retry|failed`). The resolution is recorded on
the stage and in the audit trail; Step Functions, answered through the token the stage keeps,
decides what it means."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from relevo_core.config import TableSettings
from relevo_core.execution import TaskGone, fail_task, succeed_task
from relevo_core.models.envelope import validation_error
from relevo_core.models.errors import ErrorClass, ErrorCode, RelevoError
from relevo_core.models.requests import Resolution
from relevo_core.models.status import StageStatus
from relevo_core.store import jobs, reviews, task_tokens
from relevo_core.store.audit import record_action


def resolve_stage(settings: TableSettings, job_id: str, stage: str, body: Any, actor: str) -> dict[str, Any]:
    try:
        resolution = Resolution.model_validate(body or {})
    except ValidationError as exc:
        raise validation_error(exc) from exc
    if resolution.as_ == "failed" and not resolution.reason:
        raise RelevoError(ErrorCode.VALIDATION_FAILED, "reason: resolving as failed needs a reason")
    planned = jobs.get_envelope(settings.table_name, job_id).stages
    names = [stage_plan.name for stage_plan in planned]
    if stage not in names:
        raise RelevoError(ErrorCode.STAGE_UNKNOWN, f"job {job_id} has no stage {stage!r}")
    index, shard = names.index(stage), resolution.shard
    # A stage with shards is reviewed shard by shard (its own record is never in review); a
    # stage without shards has none to name.
    shards = planned[index].shard_count if planned[index].sharded else 0
    if (shard is None) != (shards == 0) or (shard is not None and shard >= shards):
        wanted = f"a shard between 0 and {shards - 1}" if shards else "no shard"
        raise RelevoError(ErrorCode.VALIDATION_FAILED, f"shard: stage {stage} of {job_id} takes {wanted}")
    named = stage if shard is None else f"{stage} shard {shard}"
    record = reviews.review(settings.table_name, job_id, index, shard)
    # The review's token, from the job's token partition (which no job session reads), for the
    # attempt the stage record says is in review.
    waiting = task_tokens.review_token(settings.table_name, job_id, index, shard)
    if (
        record.get("status") != StageStatus.MANUAL_REVIEW.value
        or waiting is None
        or waiting.attempt != record.get("review_attempt")
    ):
        raise RelevoError(
            ErrorCode.STAGE_NOT_IN_REVIEW,
            f"stage {named} of {job_id} is {record.get('status', 'pending')}, not in manual review",
        )
    token = waiting.token
    now = datetime.now(UTC)
    try:
        reviews.record_resolution(
            settings.table_name,
            job_id,
            index,
            waiting.attempt,
            resolution.as_,
            actor,
            resolution.reason,
            now,
            shard,
        )
    except reviews.NotInReview as exc:
        raise RelevoError(
            ErrorCode.STAGE_NOT_IN_REVIEW, f"stage {named} of {job_id} was resolved meanwhile"
        ) from exc
    try:
        if resolution.as_ == "failed":
            fail_task(token, ErrorClass.RESOLVED_FAILED.value, f"{actor}: {resolution.reason}")
        else:
            succeed_task(token, {"resolution": resolution.as_, "actor": actor, "reason": resolution.reason})
    except TaskGone as exc:
        raise RelevoError(
            ErrorCode.STAGE_NOT_IN_REVIEW, f"job {job_id} no longer waits on stage {named}"
        ) from exc
    record_action(
        settings.table_name,
        job_id,
        "stage.resolve",
        actor,
        now,
        stage=stage,
        resolution=resolution.as_,
        reason=resolution.reason,
        evidence=record.get("reconciled"),
        **({"shard": shard} if shard is not None else {}),
    )
    return {
        "job_id": job_id,
        "stage": stage,
        "resolution": resolution.as_,
        "actor": actor,
        **({"shard": shard} if shard is not None else {}),
    }
