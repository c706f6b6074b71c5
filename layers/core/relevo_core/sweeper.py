"""The sweep that makes sure no accepted job is forgotten.

Intake writes a job and then starts its execution: two calls, so a crash between them can leave
a job written but never started. Every such job carries a sparse index entry until its
execution's first state removes it; the sweep starts whatever has waited too long.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable

from botocore.exceptions import ClientError

from relevo_core import key_freeze
from relevo_core.aws import client
from relevo_core.config import IntakeSettings
from relevo_core.intake import start_execution, work_queue_url
from relevo_core.store import agents, locks, wait_order
from relevo_core.store.jobs import clear_start_pending, get_envelope, start_pending_jobs

# A job younger than this is probably being started right now by intake.
MIN_AGE = timedelta(seconds=30)


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "already_running": self.already_running,
            "locks_freed": self.locks_freed,
            "waiters_dropped": self.waiters_dropped,
            "keys_frozen": self.keys_frozen,
        }


def online_agent_counts(table: str, regions: Iterable[str], now: datetime) -> dict[str, int]:
    """How many agents each of the stack's regions has online at `now`. Every region named gets
    a count, a region with no presence records at all included (0): the zero-online alarm reads
    these, and a region that reported nothing would look the same as a sweep that never ran."""
    return {region: len(agents.online_agents(table, region, now)) for region in regions}


def execution_arn(state_machine_arn: str, name: str) -> str:
    return state_machine_arn.replace(":stateMachine:", ":execution:", 1) + f":{name}"


def sweep(settings: IntakeSettings, now: datetime, notification_topic_arn: str | None = None) -> SweepReport:
    report = start_forgotten_jobs(settings, now)
    free_locks_of_ended_executions(settings, report)
    drop_ended_waiters(settings, report)
    if notification_topic_arn:
        report.keys_frozen = key_freeze.evaluate_pending(settings.table_name, notification_topic_arn, now)
    return report


def _execution_status(settings: IntakeSettings, name: str) -> str:
    try:
        return str(client("stepfunctions").describe_execution(executionArn=execution_arn(settings.state_machine_arn, name))["status"])
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ExecutionDoesNotExist":
            raise
        return "MISSING"


def free_locks_of_ended_executions(settings: IntakeSettings, report: SweepReport) -> None:
    """A project lock is released on every ending the state machine sees; an abort, a stop or an
    execution timeout ends it without a last state, so the sweep releases those."""
    for project_id, holders in locks.lock_holders(settings.table_name).items():
        for name in holders:
            if _execution_status(settings, name) != "RUNNING" and locks.release(settings.table_name, project_id, name):
                report.locks_freed.append(f"{project_id}:{name}")


def drop_ended_waiters(settings: IntakeSettings, report: SweepReport) -> None:
    """A waiting job whose execution was stopped, aborted or timed out would stay first in its
    project's order and block every job behind it: the sweep takes it out of the order."""
    for project_id, waiters in locks.lock_waiters(settings.table_name).items():
        for name in waiters:
            if _execution_status(settings, name) != "RUNNING" and wait_order.drop_waiter(settings.table_name, project_id, name):
                report.waiters_dropped.append(f"{project_id}:{name}")


def start_forgotten_jobs(settings: IntakeSettings, now: datetime) -> SweepReport:
    report = SweepReport()
    sfn = client("stepfunctions")
    for job_id in start_pending_jobs(settings.table_name, created_before=now - MIN_AGE):
        try:
            described = sfn.describe_execution(executionArn=execution_arn(settings.state_machine_arn, job_id))
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ExecutionDoesNotExist":
                raise
            envelope = get_envelope(settings.table_name, job_id)
            start_execution(
                settings.state_machine_arn, envelope, work_queue_url(settings.work_queue_prefix, envelope.region_affinity)
            )
            report.started.append(job_id)
            continue
        report.already_running.append(job_id)
        if described["status"] != "RUNNING":
            # It ran and ended before its first state could clear the marker.
            clear_start_pending(settings.table_name, job_id)
    return report
