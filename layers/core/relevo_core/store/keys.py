"""Key layout of the single Relevo table. Every access pattern builds its keys here."""

from __future__ import annotations

JOB_SK = "JOB"
PROJECT_SK = "PROJECT"
DEDUP_SK = "DEDUP"


def job_pk(job_id: str) -> str:
    return f"JOB#{job_id}"


def stage_sk(index: int) -> str:
    # Zero-padded so stages sort in plan order under their job.
    return f"STAGE#{index:02d}"


def project_pk(project_id: str) -> str:
    return f"PROJECT#{project_id}"


def dedup_pk(idempotency_key: str) -> str:
    return f"DEDUP#{idempotency_key}"


def key(pk: str, sk: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}
