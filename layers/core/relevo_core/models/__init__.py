"""The shared contract: every boundary in Relevo speaks these models."""

from relevo_core.models.envelope import (
    ENVELOPE_SCHEMA_VERSION,
    JobEnvelope,
    Trigger,
    TriggerType,
    new_job_id,
    read_envelope,
)
from relevo_core.models.errors import ErrorClass, ErrorCode, RelevoError
from relevo_core.models.plan import ApprovalSettings, RetryPolicy, StagePlan
from relevo_core.models.project import Project, ProjectStage, WebhookSecrets
from relevo_core.models.status import JobStatus, QueueReason, StageStatus

__all__ = [
    "ENVELOPE_SCHEMA_VERSION",
    "ApprovalSettings",
    "ErrorClass",
    "ErrorCode",
    "JobEnvelope",
    "JobStatus",
    "Project",
    "ProjectStage",
    "QueueReason",
    "RelevoError",
    "RetryPolicy",
    "StagePlan",
    "StageStatus",
    "Trigger",
    "TriggerType",
    "WebhookSecrets",
    "new_job_id",
    "read_envelope",
]
