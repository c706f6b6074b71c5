"""Intake: every trigger becomes exactly one job per idempotency key, then one execution."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_core.config import IntakeSettings
from relevo_core.models.envelope import JobEnvelope, Trigger, new_job_id
from relevo_core.models.project import Project
from relevo_core.store import jobs
from relevo_core.store.keys import stage_sk

# A redelivery inside this window is the same trigger. It must outlast the longest handoff
# (queue + exec + lease) so that a slow job is never started twice.
DEFAULT_DEDUP_WINDOW_SEC = 24 * 3600


@dataclass(frozen=True)
class IntakeResult:
    job_id: str
    duplicate: bool


def idempotency_key(project: Project, commit: str) -> str:
    """project + commit + artifact set: the same push of the same plan is the same work."""
    artifact_set = hashlib.sha256(
        json.dumps([stage.name for stage in project.stages]).encode()
    ).hexdigest()[:16]
    return f"{project.id}:{commit}:{artifact_set}"


def build_envelope(
    settings: IntakeSettings,
    project: Project,
    trigger: Trigger,
    ref: str,
    commit: str,
    now: datetime,
) -> JobEnvelope:
    job_id = new_job_id(now.timestamp())
    return JobEnvelope(
        job_id=job_id,
        idempotency_key=idempotency_key(project, commit),
        project=project.id,
        region_affinity=project.region_affinity,
        artifact_uri=f"s3://{settings.artifact_bucket}/{project.id}/{job_id}/",
        created_at=now,
        ttl=int((now + timedelta(days=settings.job_retention_days)).timestamp()),
        trigger=trigger,
        priority=project.priority,
        ref=ref,
        commit=commit,
        stages=project.frozen_stages(),
        queue_timeout_sec=project.queue_timeout_sec,
        exec_timeout_sec=max(stage.exec_timeout_sec for stage in project.stages),
        lease_ttl_sec=project.lease_ttl_sec,
        approval=project.approval,
    )


@lru_cache(maxsize=64)
def work_queue_url(prefix: str, region_affinity: str) -> str:
    """The region's work queue, resolved once per container."""
    return client("sqs").get_queue_url(QueueName=f"{prefix}{region_affinity}")["QueueUrl"]


def execution_input(envelope: JobEnvelope, queue_url: str) -> dict[str, Any]:
    """What the state machine needs to drive the job; the agent reads the rest from the envelope."""
    return {
        "job_id": envelope.job_id,
        "project": envelope.project,
        "queue_url": queue_url,
        "lease_ttl_sec": envelope.lease_ttl_sec,
        "stages": [
            {
                "index": index,
                "name": stage.name,
                "stage_key": stage_sk(index),
                # Dispatch waits for a claim, then for the run: both bounded here.
                "timeout_sec": envelope.queue_timeout_sec + stage.exec_timeout_sec,
            }
            for index, stage in enumerate(envelope.stages)
        ],
    }


def start_execution(state_machine_arn: str, envelope: JobEnvelope, queue_url: str) -> None:
    """Start the job's execution, named by its job id so a second start cannot run it twice."""
    try:
        client("stepfunctions").start_execution(
            stateMachineArn=state_machine_arn,
            name=envelope.job_id,
            input=json.dumps(execution_input(envelope, queue_url)),
        )
    except ClientError as exc:
        # AWS answers success for an open execution with the same name and input; the emulator
        # raises ExecutionAlreadyExists. Either way the job is already started.
        if exc.response["Error"]["Code"] != "ExecutionAlreadyExists":
            raise


def enqueue(
    settings: IntakeSettings,
    project: Project,
    trigger: Trigger,
    ref: str,
    commit: str,
    now: datetime | None = None,
) -> IntakeResult:
    now = now or datetime.now(timezone.utc)
    envelope = build_envelope(settings, project, trigger, ref, commit, now)
    queue_url = work_queue_url(settings.work_queue_prefix, envelope.region_affinity)
    created = jobs.create_job(settings.table_name, envelope, DEFAULT_DEDUP_WINDOW_SEC, now)
    if not created.created:
        return IntakeResult(job_id=created.job_id, duplicate=True)
    start_execution(settings.state_machine_arn, envelope, queue_url)
    return IntakeResult(job_id=envelope.job_id, duplicate=False)
