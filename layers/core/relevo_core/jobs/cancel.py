"""Cancel: a job stops wherever it is, and everything it held is given back."""

from __future__ import annotations

from datetime import UTC, datetime

from relevo_core.config import ExecutionSettings
from relevo_core.execution import stop_execution
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import JobStatus, StageStatus
from relevo_core.projects.lock_handoff import wake_next_waiter
from relevo_core.store import job_status, jobs, locks, stage_endings, wait_order

_ATTEMPTS = 5


def cancel_job(settings: ExecutionSettings, job_id: str, actor: str) -> dict[str, str]:
    """queued: canceled without dispatch (its queue slot given back). dispatched, running or
    waiting: the execution is stopped and the open stage is `canceled`; the agent holding it
    learns it from its next renewal (every min(lease/3, 3 s)), which is refused, and kills the
    stage's process group. The project lock is released, and the job leaves its project's
    waiting order, either way."""
    for _ in range(_ATTEMPTS):
        record = jobs.get_job_record(settings.table_name, job_id)
        status = JobStatus(record["status"])
        if status.terminal:
            raise RelevoError(ErrorCode.JOB_ALREADY_ENDED, f"job {job_id} already ended {status.value}")
        try:
            job_status.mark_canceled(
                settings.table_name, job_id, status, actor, settings.queue_limit, datetime.now(UTC)
            )
            break
        except job_status.StatusChanged:
            continue
    else:
        raise RelevoError(ErrorCode.JOB_ALREADY_ENDED, f"job {job_id} kept changing; try again")
    if status is not JobStatus.HELD:
        stop_execution(settings.machines, job_id, cause=f"canceled by {actor}")
    # The stage it was on ends with it: the holder's next renewal is refused (so its command is
    # stopped within one renew interval), and no agent may claim it any more.
    stage_endings.end_open_stages(
        settings.table_name, job_id, StageStatus.CANCELED, datetime.now(UTC), f"cancel:{actor}"
    )
    locks.release(settings.table_name, record["project"], job_id)
    # A job canceled while it waited for its project leaves the waiting order at once.
    wait_order.drop_waiter(settings.table_name, record["project"], job_id)
    # Either frees the project for the next job, which is parked until woken.
    wake_next_waiter(settings.table_name, record["project"])
    return {"job_id": job_id, "status": JobStatus.CANCELED.value, "was": status.value}
