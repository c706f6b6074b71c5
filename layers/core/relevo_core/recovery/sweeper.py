"""The sweep that makes sure no accepted job is forgotten.

Intake writes a job and then starts its execution: two calls, so a crash between them can leave
a job written but never started. Every such job carries a sparse index entry until its
execution's first state removes it; the sweep starts whatever has waited too long.

An execution stopped, aborted or timed out from outside Relevo (the console, the API) ends with no
last state: its job would stay queued or running, hold its project lock, its place in the
project's waiting order and, while queued, a global queue slot. The sweep finds such executions
among lock holders, waiters and unstarted jobs, and for each one first mirrors the ending onto
the job (canceled for ABORTED; failed with cause execution_timed_out or execution_failed, last
writer `sweeper`) and gives back its queue slot, then frees the lock and the waiting place. Each
step is conditional, so a repeated or interrupted sweep finishes the work and changes nothing
twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from relevo_core.config import IntakeSettings
from relevo_core.config.sweeper import SweeperSettings
from relevo_core.execution import MISSING, execution_status, start_job_execution
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import JobStatus, StageStatus
from relevo_core.observability import logger, metrics
from relevo_core.projects.lock_handoff import wake_next_waiter
from relevo_core.recovery import key_freeze
from relevo_core.store import agents, job_status, jobs, locks, region_online, stage_endings, wait_order
from relevo_core.store.jobs import get_envelope
from relevo_core.store.keys import MACHINE_ATTRIBUTE, RUN_MACHINE
from relevo_core.store.start_pending import clear_start_pending, start_pending_jobs

# A job younger than this is probably being started right now by intake.
MIN_AGE = timedelta(seconds=30)


@dataclass(frozen=True)
class Ending:
    """What an execution's ending outside Relevo means for its job."""

    status: JobStatus
    error_name: str | None = None
    error_cause: str | None = None


# Execution status (DescribeExecution) -> the job's final status. Any other status (RUNNING,
# SUCCEEDED, PENDING_REDRIVE, or no such execution) leaves the job as it is: the state machine
# writes a success itself, and a redriven execution is not over.
ENDINGS: dict[str, Ending] = {
    "ABORTED": Ending(JobStatus.CANCELED),
    "TIMED_OUT": Ending(JobStatus.FAILED, "Relevo.Execution.TimedOut", "execution_timed_out"),
    "FAILED": Ending(JobStatus.FAILED, "Relevo.Execution.Failed", "execution_failed"),
}
_MIRROR_ATTEMPTS = 5


@dataclass
class SweepReport:
    started: list[str] = field(default_factory=list)
    already_running: list[str] = field(default_factory=list)
    # "project:execution" of locks freed because their execution had ended.
    locks_freed: list[str] = field(default_factory=list)
    # "project:job" of jobs dropped from a project's waiting order because their execution ended.
    waiters_dropped: list[str] = field(default_factory=list)
    # Idempotency keys frozen by this sweep (see key_freeze).
    keys_frozen: list[str] = field(default_factory=list)
    # "job:status" of jobs given the final status of an execution that ended outside Relevo.
    jobs_ended: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "already_running": self.already_running,
            "locks_freed": self.locks_freed,
            "waiters_dropped": self.waiters_dropped,
            "keys_frozen": self.keys_frozen,
            "jobs_ended": self.jobs_ended,
        }


def online_agent_counts(table: str, regions: Iterable[str], now: datetime) -> dict[str, int]:
    """How many agents each of the stack's regions has online at `now`. Every region named gets
    a count, a region with no presence records at all included (0): the zero-online alarm reads
    these, and a region that reported nothing would look the same as a sweep that never ran."""
    return {region: len(agents.online_agents(table, region, now)) for region in regions}


def sweep(settings: IntakeSettings, now: datetime, notification_topic_arn: str | None = None) -> SweepReport:
    report = start_forgotten_jobs(settings, now)
    free_locks_of_ended_executions(settings, report, now)
    drop_ended_waiters(settings, report, now)
    if notification_topic_arn:
        report.keys_frozen = key_freeze.evaluate_pending(settings.table_name, notification_topic_arn, now)
    return report


def end_job_of_ended_execution(
    settings: IntakeSettings, job_id: str, execution_status: str, now: datetime, report: SweepReport
) -> None:
    """Mirror an execution that ended outside Relevo onto its job: the final status, the reason,
    last_writer `sweeper`, and the queue slot back if the job was still queued. A job that already
    ended (the state machine or an operator wrote it) is left alone, so a repeat changes nothing."""
    ending = ENDINGS.get(execution_status)
    if ending is None:
        return
    for _ in range(_MIRROR_ATTEMPTS):
        try:
            record = jobs.get_job_record(settings.table_name, job_id)
        except RelevoError as exc:
            if exc.code is not ErrorCode.JOB_NOT_FOUND:
                raise
            return  # expired (TTL): nothing left to mirror
        status = JobStatus(record["status"])
        if status is JobStatus.HELD:
            return
        if not status.terminal:
            try:
                job_status.mark_ended_outside(
                    settings.table_name,
                    job_id,
                    status,
                    ending.status,
                    settings.queue_limit,
                    now,
                    ending.error_name,
                    ending.error_cause,
                )
            except job_status.StatusChanged:
                continue  # written meanwhile: read again
            report.jobs_ended.append(f"{job_id}:{ending.status.value}")
        # Nothing will finish the stage it was on (also when an earlier sweep ended the job and
        # stopped before this): it ends with the job.
        stage_endings.end_open_stages(settings.table_name, job_id, StageStatus.CANCELED, now, "sweeper")
        return


def free_locks_of_ended_executions(settings: IntakeSettings, report: SweepReport, now: datetime) -> None:
    """A project lock is released on every ending the state machine sees; an abort, a stop or an
    execution timeout ends it without a last state, so the sweep ends the job and then releases
    the lock (in that order: a sweep interrupted in between still finds the holder next time)."""
    _end_and_let_go(
        settings, locks.lock_holders(settings.table_name), locks.release, report.locks_freed, report, now
    )


def drop_ended_waiters(settings: IntakeSettings, report: SweepReport, now: datetime) -> None:
    """A waiting job whose execution was stopped, aborted or timed out would stay first in its
    project's order and block every job behind it: the sweep ends the job (giving back its queue
    slot) and takes it out of the order."""
    _end_and_let_go(
        settings,
        locks.lock_waiters(settings.table_name),
        wait_order.drop_waiter,
        report.waiters_dropped,
        report,
        now,
    )


def _end_and_let_go(
    settings: IntakeSettings,
    names_by_project: dict[str, list[str]],
    let_go: Callable[[str, str, str], bool],
    let_go_report: list[str],
    report: SweepReport,
    now: datetime,
) -> None:
    """For each execution named on a project's lock (holder or waiter) that is no longer running:
    end its job, then `let_go(table, project, execution)`; "project:execution" is reported when
    that write changed something, and the head of the project's line is woken (it is parked)."""
    for project_id, names in names_by_project.items():
        for name in names:
            status = execution_status(settings.machines, name)
            if status == "RUNNING":
                continue
            if status == MISSING and _started_its_own(settings, name, now, report):
                continue
            end_job_of_ended_execution(settings, name, status, now, report)
            if let_go(settings.table_name, project_id, name):
                let_go_report.append(f"{project_id}:{name}")
                wake_next_waiter(settings.table_name, project_id)


def _started_its_own(settings: IntakeSettings, job_id: str, now: datetime, report: SweepReport) -> bool:
    """A lock held by a job with no execution: one whose intake took the lock with it (its record
    says `machine = run`) and that is still running holds it rightly. Intake starts its execution
    right after the job's transaction; one older than MIN_AGE never got it (intake stopped in
    between), and it is started here, on the common machine. True when the lock stays the job's."""
    try:
        record = jobs.get_job_record(settings.table_name, job_id)
    except RelevoError as exc:
        if exc.code is not ErrorCode.JOB_NOT_FOUND:
            raise
        return False
    if record.get(MACHINE_ATTRIBUTE) != RUN_MACHINE or JobStatus(record["status"]).terminal:
        return False
    if datetime.fromisoformat(record["created_at"]) <= now - MIN_AGE:
        start_job_execution(settings, get_envelope(settings.table_name, job_id), took_lock=True)
        report.started.append(job_id)
    return True


def start_forgotten_jobs(settings: IntakeSettings, now: datetime) -> SweepReport:
    report = SweepReport()
    for job_id in start_pending_jobs(settings.table_name, created_before=now - MIN_AGE):
        status = execution_status(settings.machines, job_id)
        if status == MISSING:
            start_job_execution(settings, get_envelope(settings.table_name, job_id))
            report.started.append(job_id)
            continue
        report.already_running.append(job_id)
        if status != "RUNNING":
            # It ended before its first state could clear the marker (stopped while queued, for
            # one): the job ends too, giving back its queue slot.
            end_job_of_ended_execution(settings, job_id, status, now, report)
            clear_start_pending(settings.table_name, job_id)
    return report


def sweep_minute(settings: SweeperSettings, now: datetime) -> dict[str, Any]:
    """The sweeper function's minute: the fleet's online agents counted (metric OnlineAgents,
    dimension Region), then the repairs of `sweep`, counted as metrics and logged when any."""
    # Counted and flushed first, one document per region: a repair below that fails must not
    # silence the counts, which the zero-online alarm would read as an empty fleet.
    fleet = online_agent_counts(settings.table_name, settings.regions, now)
    for region, count in fleet.items():
        with single_metric(
            name="OnlineAgents", unit=MetricUnit.Count, value=count, namespace=metrics.namespace
        ) as metric:
            metric.add_dimension(name="Region", value=region)
    # A region's change between "some agent online" and "none": recorded (once, whichever sweep
    # sees it first) for the status reporter, which pages agents_offline on it. An agent killed,
    # frozen or cut off never writes its own offline record; this is how its loss is heard.
    changed = [
        region
        for region, count in fleet.items()
        if region_online.record_region_online(settings.table_name, region, count, now)
    ]
    report = sweep(settings, now, settings.notification_topic_arn)
    metrics.add_metric(name="ForgottenJobsStarted", unit=MetricUnit.Count, value=len(report.started))
    metrics.add_metric(name="ProjectLocksFreed", unit=MetricUnit.Count, value=len(report.locks_freed))
    metrics.add_metric(name="JobsEndedOutside", unit=MetricUnit.Count, value=len(report.jobs_ended))
    metrics.add_metric(name="IdempotencyKeysFrozen", unit=MetricUnit.Count, value=len(report.keys_frozen))
    if (
        report.started
        or report.jobs_ended
        or report.locks_freed
        or report.waiters_dropped
        or report.keys_frozen
    ):
        logger.warning("sweep repaired state", extra=report.to_dict())
    return {**report.to_dict(), "online_agents": fleet, "regions_changed": changed}
