"""Intake: every trigger becomes exactly one job per idempotency key, then one execution.

All five trigger types come through `enqueue`: webhook, api, manual, schedule and retry.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_core.config import IntakeSettings
from relevo_core.models.envelope import JobEnvelope, Trigger, TriggerType, new_job_id
from relevo_core.models.errors import ErrorClass, ErrorCode, RelevoError
from relevo_core.models.plan import StagePlan
from relevo_core.models.project import OnRepeat, Project
from relevo_core.models.status import HeldReason
from relevo_core.plan_limits import require_envelope_fits, require_stages_fit
from relevo_core.store import jobs
from relevo_core.store.keys import stage_sk
from relevo_core.store.projects import get_project


@dataclass(frozen=True)
class IntakeResult:
    job_id: str
    duplicate: bool = False
    # How the answer came about: created, held, duplicate, replayed_delivery, skipped.
    outcome: str = "created"
    previous_job_id: str | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"job_id": self.job_id, "duplicate": self.duplicate}
        if self.outcome not in ("created", "duplicate"):
            body["outcome"] = self.outcome
        if self.previous_job_id:
            body["previous_job_id"] = self.previous_job_id
        return body


def artifact_set(stages: tuple[StagePlan, ...]) -> str:
    return hashlib.sha256(json.dumps([stage.name for stage in stages]).encode()).hexdigest()[:16]


def idempotency_key(project_id: str, identity: str, stages: tuple[StagePlan, ...]) -> str:
    """project + what is built (commit, or the trigger's own identity) + the artifact set."""
    return f"{project_id}:{identity}:{artifact_set(stages)}"


class _ProjectCache:
    """Projects read at most once per `max_age` per container: the warm path stays at two calls.

    A project change reaches webhooks within max_age; a job already queued never changes, since
    its plan is frozen in the envelope.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], tuple[float, Project]] = {}

    def get(self, table: str, project_id: str, max_age: float) -> Project:
        now = time.monotonic()
        with self._lock:
            cached = self._entries.get((table, project_id))
        if cached and now - cached[0] < max_age:
            return cached[1]
        project = get_project(table, project_id)
        with self._lock:
            self._entries[(table, project_id)] = (now, project)
        return project

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


project_cache = _ProjectCache()


def select_stages(project: Project, names: list[str] | None) -> tuple[StagePlan, ...]:
    stages = project.frozen_stages()
    if not names:
        return stages
    known = {stage.name for stage in stages}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise RelevoError(ErrorCode.STAGE_UNKNOWN, f"stages: {', '.join(unknown)} not in project {project.id}")
    wanted = set(names)
    return tuple(stage for stage in stages if stage.name in wanted)


def build_envelope(
    settings: IntakeSettings,
    project: Project,
    trigger: Trigger,
    ref: str,
    commit: str | None,
    stages: tuple[StagePlan, ...],
    key: str,
    now: datetime,
    priority: int | None = None,
    from_stage: str | None = None,
    retry_of: str | None = None,
) -> JobEnvelope:
    job_id = new_job_id(now.timestamp())
    return JobEnvelope(
        job_id=job_id,
        idempotency_key=key,
        project=project.id,
        region_affinity=project.region_affinity,
        artifact_uri=f"s3://{settings.artifact_bucket}/{project.id}/{job_id}/",
        created_at=now,
        **settings.expiry(now),
        trigger=trigger,
        priority=project.priority if priority is None else priority,
        ref=ref,
        commit=commit,
        stages=stages,
        queue_timeout_sec=project.queue_timeout_sec,
        exec_timeout_sec=max(stage.exec_timeout_sec for stage in stages),
        lease_ttl_sec=project.lease_ttl_sec,
        approval=project.approval,
        from_stage=from_stage,
        retry_of=retry_of,
    )


@lru_cache(maxsize=64)
def work_queue_url(prefix: str, region_affinity: str) -> str:
    """The region's work queue, resolved once per container."""
    try:
        return client("sqs").get_queue_url(QueueName=f"{prefix}{region_affinity}")["QueueUrl"]
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"):
            raise RelevoError(
                ErrorCode.REGION_UNKNOWN, f"region_affinity {region_affinity!r} has no work queue in this stack"
            ) from exc
        raise


# The state machine's key for each retryable class in a stage's `attempts`.
RETRY_KEYS: dict[ErrorClass, str] = {
    ErrorClass.NETWORK_TIMEOUT: "network_timeout",
    ErrorClass.CONNECTION_RESET: "connection_reset",
    ErrorClass.STORAGE_5XX: "storage_5xx",
    ErrorClass.TRANSIENT_EXIT: "transient_exit",
    ErrorClass.AGENT_SHUTDOWN: "agent_shutdown",
    ErrorClass.LEASE_EXPIRED: "lease_expired",
}

# A job waiting for its project parks in job.asl.json's WaitForProject until a releaser wakes it
# (the releasing execution, cancel, the sweeper), and reads the lock again at least every
# fallback_sec in case a wake never comes. Every park, woken or not, spends one of `cycles`, and
# the job gives up with Relevo.Timeout.Queue when they are spent, so a wait of queue_timeout_sec
# costs at most `cycles` parks of history however long each lasts (test_waiting_history.py).
# Short waits read the lock LOCK_WAIT_READS times; long ones every LOCK_WAIT_MAX_FALLBACK_SEC:
# 288 parks for the longest queue_timeout_sec (24 h).
LOCK_WAIT_READS = 100
LOCK_WAIT_MAX_FALLBACK_SEC = 300


def lock_wait(queue_timeout_sec: int) -> dict[str, int]:
    """The wait budget job.asl.json's WaitForProject / CountWaitCycle spend: the fallback read
    period and the number of parks a wait of queue_timeout_sec may use."""
    fallback_sec = min(LOCK_WAIT_MAX_FALLBACK_SEC, max(1, math.ceil(queue_timeout_sec / LOCK_WAIT_READS)))
    return {"fallback_sec": fallback_sec, "cycles": math.ceil(queue_timeout_sec / fallback_sec)}


def execution_input(envelope: JobEnvelope, queue_url: str) -> dict[str, Any]:
    """What the state machine needs to drive the job; the agent reads the rest from the envelope.
    Timeouts, attempts and backoff all come from the frozen plan."""
    gated = envelope.approval.gated_stage([stage.name for stage in envelope.stages])
    return {
        "job_id": envelope.job_id,
        "project": envelope.project,
        # Carried for the dead-letter entry, which must be enough to resume the job.
        "envelope": envelope.to_json_dict(),
        "queue_url": queue_url,
        "lease_ttl_sec": envelope.lease_ttl_sec,
        "queue_timeout_sec": envelope.queue_timeout_sec,
        # How a job waiting for its project's lock parks (see lock_wait).
        "lock_wait": lock_wait(envelope.queue_timeout_sec),
        # The streak of conflicts the current transactional state has retried (job.asl.json's
        # <State>Canceled choices retry at most 5, with backoff and full jitter).
        "conflict": {"retries": 0},
        # A job from a later stage runs only that stage on; the earlier ones show as skipped.
        "stages": [
            {
                "index": index,
                "name": stage.name,
                "stage_key": stage_sk(index),
                # The agent ends a stage at its exec timeout; the state machine's own limit is a
                # backstop after the kill grace and one more lease.
                "exec_backstop_sec": stage.exec_timeout_sec + stage.kill_grace_sec + envelope.lease_ttl_sec,
                "attempts": {key: stage.retry.attempts_for(error) for error, key in RETRY_KEYS.items()},
                "backoff_caps_sec": stage.retry.backoff_caps_sec(),
                "gate": stage.name == gated,
                "approval_timeout_sec": envelope.approval.effective_timeout_sec,
            }
            for index, stage in enumerate(envelope.stages)
            if index >= envelope.first_stage_index
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


# Triggers no person asked for at that moment: refused while their idempotency key is frozen.
# A person's explicit run (manual, api, rerun, dlq redrive, release of a held job) still goes.
AUTOMATIC_TRIGGERS = frozenset({TriggerType.WEBHOOK, TriggerType.SCHEDULE})


def enqueue(
    settings: IntakeSettings,
    project: Project,
    trigger: Trigger,
    ref: str,
    commit: str | None,
    identity: str,
    stage_names: list[str] | None = None,
    priority: int | None = None,
    from_stage: str | None = None,
    retry_of: str | None = None,
    now: datetime | None = None,
    held_reason: HeldReason | None = None,
) -> IntakeResult:
    """One trigger in; at most one job out. `identity` is what makes two triggers the same work
    (the commit for Git triggers, the schedule slot for timers, ...). With a `held_reason` (a pull
    request from a fork) the job is written `held` and only a person's release starts it."""
    now = now or datetime.now(timezone.utc)
    # Refused before anything is written: a project stored under other limits may hold a plan
    # its jobs' executions could not carry (relevo_core.plan_limits).
    require_stages_fit(project)
    stages = select_stages(project, stage_names)
    key = idempotency_key(project.id, identity, stages)
    envelope = build_envelope(settings, project, trigger, ref, commit, stages, key, now, priority, from_stage, retry_of)
    require_envelope_fits(envelope)
    queue_url = work_queue_url(settings.work_queue_prefix, envelope.region_affinity)
    window, on_repeat = project.dedup_for(trigger.type.value)
    refuse_frozen = trigger.type in AUTOMATIC_TRIGGERS
    stands_on = None
    if envelope.first_stage_index > 0 and retry_of:
        from relevo_core.job_lineage import last_successful_before  # reruns only: not on the webhook's path

        stands_on = last_successful_before(settings.table_name, retry_of, [s.name for s in stages], envelope.first_stage_index)

    outcome = jobs.create_job(
        settings.table_name, envelope, window, settings.queue_limit, now, held_reason=held_reason,
        refuse_frozen=refuse_frozen, stands_on=stands_on,
    )
    if isinstance(outcome, jobs.RepeatAfterWindow):
        if on_repeat is OnRepeat.SKIP:
            return IntakeResult(outcome.previous_job_id, duplicate=True, outcome="skipped")
        if held_reason is None and on_repeat is OnRepeat.HOLD:
            held_reason = HeldReason.REPEAT_AFTER_WINDOW
        outcome = jobs.create_job(
            settings.table_name,
            envelope,
            window,
            settings.queue_limit,
            now,
            held_reason=held_reason,
            replaces_expires_at=outcome.previous_expires_at,
            refuse_frozen=refuse_frozen,
            stands_on=stands_on,
        )
    if isinstance(outcome, jobs.Created) and held_reason is not None:
        return IntakeResult(envelope.job_id, outcome="held")
    if isinstance(outcome, jobs.Duplicate):
        return IntakeResult(
            outcome.job_id, duplicate=True, outcome="replayed_delivery" if outcome.matched == "delivery" else "duplicate"
        )
    if isinstance(outcome, jobs.QueueFull):
        raise RelevoError(
            ErrorCode.QUEUE_FULL, f"{outcome.queued} jobs are queued, the limit is {outcome.limit}; nothing was written"
        )
    if isinstance(outcome, jobs.KeyFrozen):
        raise RelevoError(
            ErrorCode.KEY_FROZEN,
            f"idempotency key {outcome.idempotency_key} is frozen after repeated dead-lettering; "
            f"automatic runs are refused until `relevo dlq unfreeze` lifts it",
            idempotency_key=outcome.idempotency_key,
        )
    if isinstance(outcome, jobs.RepeatAfterWindow):  # taken over by a concurrent repeat
        return IntakeResult(outcome.previous_job_id, duplicate=True)
    start_execution(settings.state_machine_arn, envelope, queue_url)
    return IntakeResult(envelope.job_id)
