"""Key layout of the single Relevo table. Every access pattern builds its keys here."""

from __future__ import annotations

JOB_SK = "JOB"
PROJECT_SK = "PROJECT"
DEDUP_SK = "DEDUP"
DELIVERY_SK = "DELIVERY"
COUNTER_SK = "COUNTER"
# The one item counting jobs that are queued (written, not yet started).
QUEUE_COUNTER_PK = "COUNTER#queued"
# Sparse GSI (StartPendingIndex): jobs whose execution has not yet run its first state.
START_PENDING_ATTRIBUTE = "start_pending"
START_PENDING = "pending"
START_PENDING_INDEX = "StartPendingIndex"
# GSI over `kind` (projects, ...) sorted by pk: listings without scans.
KIND_INDEX = "KindIndex"
PROJECT_KIND = "project"
# GSI over (project, created_at): a project's jobs by time, for listings and filters.
PROJECT_JOBS_INDEX = "ProjectJobsIndex"
# Set on job records only (a project's own record keeps its settings in `project`, a map).
PROJECT_JOBS_ATTRIBUTE = "project_jobs"
LOCK_KIND = "lock"
DLQ_KIND = "dlq"
DLQ_SK = "DLQ"
LOCK_SK = "LOCK"


def job_pk(job_id: str) -> str:
    return f"JOB#{job_id}"


def stage_sk(index: int) -> str:
    # Zero-padded so stages sort in plan order under their job.
    return f"STAGE#{index:02d}"


def project_pk(project_id: str) -> str:
    return f"PROJECT#{project_id}"


def audit_pk(job_id: str) -> str:
    return f"AUDIT#{job_id}"


def dlq_pk(job_id: str) -> str:
    return f"DLQ#{job_id}"


def lock_pk(project_id: str) -> str:
    return f"LOCK#{project_id}"


def dedup_pk(idempotency_key: str) -> str:
    return f"DEDUP#{idempotency_key}"


def delivery_pk(source: str, delivery_id: str) -> str:
    return f"DELIVERY#{source}#{delivery_id}"


def key(pk: str, sk: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def log_pk(job_id: str) -> str:
    # Log chunks live under their own partition: reading a job never pages through its output.
    return f"LOGS#{job_id}"


def log_sk(seq: int) -> str:
    # Zero-padded so chunks sort by seq.
    return f"SEQ#{seq:012d}"


def artifact_pk(job_id: str) -> str:
    return f"ARTIFACTS#{job_id}"


def artifact_sk(stage: str, path: str) -> str:
    return f"{stage}#{path}"
