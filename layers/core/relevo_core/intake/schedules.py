"""The schedule trigger: project timers kept in EventBridge Scheduler, fired through intake.

The registry keeps one Scheduler schedule per declared project schedule, named
`{project_id}--{schedule}` in the stack's schedule group; each invokes the schedule-trigger
function with `{"project_id", "schedule", "scheduled_time"}`. A timer that fires twice for the
same slot (Scheduler delivers at least once) makes one job: the slot is the job's identity.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relevo_core.aws import client, error_code
from relevo_core.config import IntakeSettings
from relevo_core.config.scheduler import SchedulerSettings
from relevo_core.intake.enqueue import IntakeResult, enqueue
from relevo_core.models.envelope import PROJECT_ID, Trigger, TriggerType
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.project import Project
from relevo_core.models.project_schedule import ProjectSchedule
from relevo_core.observability import logger

# EventBridge Scheduler fills this in with the slot's time (ISO 8601, UTC) on every invocation.
SCHEDULED_TIME = "<aws.scheduler.scheduled-time>"
SCHEDULER_NAME_MAX = 64
SEPARATOR = "--"


def scheduler_name(project_id: str, schedule: str) -> str:
    return f"{project_id}{SEPARATOR}{schedule}"


def check_scheduler_names(project: Project) -> None:
    """Scheduler names are at most 64 characters: a long project id leaves less room."""
    too_long = [
        s.name for s in project.schedules if len(scheduler_name(project.id, s.name)) > SCHEDULER_NAME_MAX
    ]
    if too_long:
        raise RelevoError(
            ErrorCode.VALIDATION_FAILED,
            f"schedules: {project.id}{SEPARATOR}<name> must be at most {SCHEDULER_NAME_MAX} characters, "
            f"too long: {', '.join(too_long)}",
        )


# ------------------------------------------------------------------ firing


class ScheduleEvent(BaseModel):
    """What the Scheduler target's Input carries, once Scheduler has filled in the slot."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    project_id: str = Field(pattern=PROJECT_ID)
    schedule: str = Field(pattern=r"^[a-z][a-z0-9-]{0,47}$")
    scheduled_time: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def fire_schedule(settings: IntakeSettings, event: Any) -> IntakeResult | None:
    """One Scheduler invocation in; at most one job per (project, schedule, slot) out.

    A malformed event, a vanished project or a vanished schedule is logged and ignored: raising
    would only make Scheduler retry something that can never succeed.
    """
    try:
        fired = ScheduleEvent.model_validate(event)
    except ValidationError as exc:
        logger.error("schedule event ignored: malformed", extra={"errors": exc.errors(include_url=False)})
        return None
    context = {
        "project": fired.project_id,
        "schedule": fired.schedule,
        "scheduled_time": fired.scheduled_time,
    }
    from relevo_core.store.projects import get_project  # read fresh: never the intake cache

    try:
        project = get_project(settings.table_name, fired.project_id)
    except RelevoError as exc:
        if exc.code is ErrorCode.PROJECT_NOT_FOUND:
            logger.warning("schedule event ignored: the project is gone", extra=context)
            return None
        raise
    schedule = project.schedule(fired.schedule)
    if schedule is None:
        logger.warning("schedule event ignored: the project no longer declares this schedule", extra=context)
        return None
    try:
        result = _enqueue_slot(settings, project, schedule, fired)
    except RelevoError as exc:
        if exc.code is not ErrorCode.KEY_FROZEN:
            raise
        # Retrying cannot help until an operator unfreezes the key: acknowledge the slot.
        logger.warning(
            "schedule event refused: its idempotency key is frozen", extra={**context, "error": exc.message}
        )
        return None
    logger.info("schedule fired", extra={**context, "job_id": result.job_id, "outcome": result.outcome})
    return result


def _enqueue_slot(
    settings: IntakeSettings, project: Project, schedule: ProjectSchedule, fired: ScheduleEvent
) -> IntakeResult:
    return enqueue(
        settings,
        project,
        Trigger(
            type=TriggerType.SCHEDULE,
            source="scheduler",
            # Delivery ids are global per source: the project is part of the slot's name.
            delivery_id=f"{scheduler_name(project.id, schedule.name)}:{fired.scheduled_time}",
        ),
        ref=schedule.ref or project.default_ref,
        commit=None,
        identity=f"schedule:{schedule.name}:{fired.scheduled_time}",
        stage_names=schedule.stages,
    )


# ------------------------------------------------------------------ registry sync


def schedule_request(
    settings: SchedulerSettings, project_id: str, schedule: ProjectSchedule
) -> dict[str, Any]:
    """The CreateSchedule/UpdateSchedule parameters of one project schedule."""
    return {
        "Name": scheduler_name(project_id, schedule.name),
        "GroupName": settings.schedule_group,
        "ScheduleExpression": schedule.expression,
        "ScheduleExpressionTimezone": schedule.timezone,
        "FlexibleTimeWindow": {"Mode": "OFF"},
        "State": "ENABLED",
        "Description": f"relevo: project {project_id}, schedule {schedule.name}",
        "Target": {
            "Arn": settings.schedule_target_arn,
            "RoleArn": settings.scheduler_role_arn,
            "Input": json.dumps(
                {"project_id": project_id, "schedule": schedule.name, "scheduled_time": SCHEDULED_TIME}
            ),
            # A slot older than an hour is not worth a job any more.
            "RetryPolicy": {"MaximumEventAgeInSeconds": 3600, "MaximumRetryAttempts": 20},
        },
    }


def sync_schedules(
    settings: SchedulerSettings,
    project_id: str,
    wanted: tuple[ProjectSchedule, ...],
    previous: tuple[ProjectSchedule, ...] = (),
) -> None:
    """Make the group hold exactly `wanted` for this project: create or update each, and delete
    the previously declared ones that are gone. Idempotent, so a failed apply is simply repeated.

    The previous declaration (not ListSchedules) says what to delete: ListSchedules cannot be
    scoped to a group in IAM, and the registry's role stays scoped to its group's schedules.
    """
    scheduler = client("scheduler")
    for schedule in wanted:
        request = schedule_request(settings, project_id, schedule)
        try:
            scheduler.update_schedule(**request)
        except ClientError as exc:
            if error_code(exc) != "ResourceNotFoundException":
                raise
            try:
                scheduler.create_schedule(**request)
            except ClientError as created:
                if error_code(created) != "ConflictException":  # created concurrently: update it
                    raise
                scheduler.update_schedule(**request)
    kept = {schedule.name for schedule in wanted}
    for schedule in previous:
        if schedule.name in kept:
            continue
        try:
            scheduler.delete_schedule(
                Name=scheduler_name(project_id, schedule.name), GroupName=settings.schedule_group
            )
        except ClientError as exc:
            if error_code(exc) != "ResourceNotFoundException":
                raise
