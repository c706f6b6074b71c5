"""The approval gate, from the operator's side: approve or reject a waiting job, with an audit
record of who did it, when and why. Step Functions decides what the answer means."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from relevo_core.config import TableSettings
from relevo_core.execution import TaskGone, fail_task, succeed_task
from relevo_core.models.envelope import validation_error
from relevo_core.models.errors import ErrorClass, ErrorCode, RelevoError
from relevo_core.models.requests import ApprovalDecision
from relevo_core.store import jobs, task_tokens
from relevo_core.store.audit import record_action


def _waiting_token(settings: TableSettings, job_id: str) -> tuple[str, str]:
    """The gate's token, from the job's token partition (which no job session reads), for the
    stage the job record says it waits before."""
    record = jobs.get_job_record(settings.table_name, job_id)
    stage = str(record.get("waiting_stage", ""))
    gate = (
        task_tokens.approval_token(settings.table_name, job_id) if record.get("status") == "waiting" else None
    )
    if gate is None or gate.stage != stage:
        raise RelevoError(
            ErrorCode.JOB_NOT_WAITING, f"job {job_id} is {record.get('status')}, not waiting for approval"
        )
    return gate.token, stage


def answer_approval(
    settings: TableSettings, job_id: str, approve: bool, body: Any, actor: str
) -> dict[str, Any]:
    try:
        decision = ApprovalDecision.model_validate(body or {})
    except ValidationError as exc:
        raise validation_error(exc) from exc
    if not approve and not decision.reason:
        raise RelevoError(ErrorCode.VALIDATION_FAILED, "reason: a rejection needs a reason")
    token, stage = _waiting_token(settings, job_id)
    try:
        if approve:
            succeed_task(token, {"approved_by": actor, "reason": decision.reason})
        else:
            fail_task(token, ErrorClass.APPROVAL_REJECTED.value, decision.reason or "")
    except TaskGone as exc:
        raise RelevoError(ErrorCode.JOB_NOT_WAITING, f"job {job_id} no longer waits for approval") from exc
    action = "job.approve" if approve else "job.reject"
    now = datetime.now(UTC)
    record_action(settings.table_name, job_id, action, actor, now, reason=decision.reason, stage=stage)
    jobs.record_approval_decision(
        settings.table_name,
        job_id,
        {
            "decision": "approved" if approve else "rejected",
            "actor": actor,
            "reason": decision.reason,
            "stage": stage,
            "at": now.isoformat(),
        },
    )
    return {"job_id": job_id, "action": action, "stage": stage, "actor": actor}
