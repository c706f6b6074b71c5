"""Job and stage-attempt lifecycles, and why a job is waiting in the queue."""

from __future__ import annotations

from enum import Enum


class JobStatus(str, Enum):
    # Written but not started, kept for an operator to release (see HeldReason).
    HELD = "held"
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def terminal(self) -> bool:
        return self in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED}


class StageStatus(str, Enum):
    PENDING = "pending"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    # Succeeded with something to look at: it exited with one of its warning_exit_codes, or printed
    # lines marked `::warning::`. The job goes on as after a success.
    WARNING = "warning"
    FAILED = "failed"
    SKIPPED = "skipped"
    # Its job ended (canceled, failed elsewhere, swept) while the stage was still open: it stops
    # here, and no attempt may claim it any more.
    CANCELED = "canceled"
    # The outcome was never acknowledged; reconciliation decides what really happened.
    UNKNOWN = "unknown"
    RECONCILED = "reconciled"
    MANUAL_REVIEW = "manual_review"

    @property
    def terminal(self) -> bool:
        return self in {
            StageStatus.SUCCEEDED,
            StageStatus.WARNING,
            StageStatus.FAILED,
            StageStatus.SKIPPED,
            StageStatus.CANCELED,
        }

    @property
    def succeeded(self) -> bool:
        """Its effect is done and the job goes on: succeeded, with warnings or not."""
        return self in {StageStatus.SUCCEEDED, StageStatus.WARNING}


# Stage record statuses a later stage, a rerun and the job's last successful stage count as done.
SUCCEEDED_STAGE = frozenset({StageStatus.SUCCEEDED.value, StageStatus.WARNING.value})


class HeldReason(str, Enum):
    """Why a job was written `held` (the job record's `held_reason`, removed on release)."""

    # A pull request whose head commits come from another repository (fork_pull_requests: hold).
    FORK_PULL_REQUEST = "fork_pull_request"
    # The same work again after its dedup window (on_repeat: hold).
    REPEAT_AFTER_WINDOW = "repeat_after_window"


class QueueReason(str, Enum):
    # Another job of its project holds the project's lock and runs.
    PROJECT_RUNNING = "project_running"
    # The job holding the project's lock waits at its approval gate (the views name it, the stage
    # and since when: relevo_core.jobs.project_wait); the queue timeout does not run meanwhile.
    PROJECT_WAITING_FOR_APPROVAL = "project_waiting_for_approval"
    AGENT_BUSY = "agent_busy"
    AGENT_OFFLINE = "agent_offline"
    # Every online agent of the region is paused (or draining), or the region's dispatch is.
    AGENT_PAUSED = "agent_paused"
    # No online agent of the region meets the stage's `requires` (the view names the nearest).
    NO_MATCHING_AGENT = "no_matching_agent"
    # Every online agent of the region is below its min_free_disk_gb (its presence says so).
    AGENT_LOW_DISK = "agent_low_disk"


def queue_reason_words(reason: str, region: str | None = None, detail: str | None = None) -> str:
    """Why a job waits, in words (the API's reason codes stay the contract): what `relevo job
    logs`, `relevo job view`, the queue and the console say."""
    where = f"region affinity {region}" if region else "its region affinity"
    words = {
        QueueReason.PROJECT_RUNNING.value: "another job of its project is running: it starts when that one "
        "ends",
        QueueReason.PROJECT_WAITING_FOR_APPROVAL.value: detail
        or "the job of its project ahead of it waits for approval: it starts when that one ends",
        QueueReason.AGENT_OFFLINE.value: f"no agent of {where} is online",
        QueueReason.AGENT_BUSY.value: f"every agent of {where} has all its slots in use",
        QueueReason.AGENT_PAUSED.value: f"the agents of {where} are paused or draining, or its dispatch is "
        "paused",
        QueueReason.NO_MATCHING_AGENT.value: detail
        or f"no online agent of {where} meets the stage's requires",
        QueueReason.AGENT_LOW_DISK.value: f"every online agent of {where} is below its min_free_disk_gb of "
        "free disk",
    }
    return words.get(reason, detail or reason)
