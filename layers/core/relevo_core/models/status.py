"""Job and stage-attempt lifecycles, and why a job is waiting in the queue."""

from __future__ import annotations

from enum import Enum


class JobStatus(str, Enum):
    # A repeat after its dedup window, kept for an operator to release (on_repeat: hold).
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
    FAILED = "failed"
    SKIPPED = "skipped"
    # The outcome was never acknowledged; reconciliation decides what really happened.
    UNKNOWN = "unknown"
    RECONCILED = "reconciled"
    MANUAL_REVIEW = "manual_review"

    @property
    def terminal(self) -> bool:
        return self in {StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.SKIPPED}


class QueueReason(str, Enum):
    PROJECT_RUNNING = "project_running"
    AGENT_BUSY = "agent_busy"
    AGENT_OFFLINE = "agent_offline"
