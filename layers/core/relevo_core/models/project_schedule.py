"""A project's schedules: timers that trigger it, one EventBridge Scheduler schedule each."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

_RATE = re.compile(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)")
# cron(minutes hours day-of-month month day-of-week year), EventBridge's six-field form.
_CRON = re.compile(r"cron\(([^()\s]+(?: [^()\s]+){5})\)")
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*?,/#-]+$")
_TIMEZONE = re.compile(r"^(UTC|[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2})$")


def check_schedule_expression(expression: str) -> str:
    """EventBridge Scheduler's recurring forms: rate(N unit) and cron(six fields)."""
    rate = _RATE.fullmatch(expression)
    if rate:
        count, unit = int(rate.group(1)), rate.group(2)
        if count < 1:
            raise ValueError(f"{expression!r}: a rate must be at least 1")
        if (count == 1) != (not unit.endswith("s")):
            raise ValueError(f"{expression!r}: the unit is singular for 1 and plural otherwise")
        return expression
    cron = _CRON.fullmatch(expression)
    if cron:
        fields = cron.group(1).split(" ")
        if not all(_CRON_FIELD.match(field) for field in fields):
            raise ValueError(f"{expression!r}: a cron field holds digits, names and , - * ? / L W # only")
        day_of_month, day_of_week = fields[2], fields[4]
        if (day_of_month == "?") == (day_of_week == "?"):
            raise ValueError(f"{expression!r}: exactly one of day-of-month and day-of-week must be ?")
        return expression
    raise ValueError(
        f"{expression!r} is neither rate(N minute|minutes|hour|hours|day|days) nor cron(min hour dom month "
        "dow year)"
    )


class ProjectSchedule(BaseModel):
    """A timer that triggers the project: one EventBridge Scheduler schedule per entry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        pattern=r"^[a-z][a-z0-9-]{0,47}$",
        description="Unique in the project, without '--'; the Scheduler entry is <project>--<name> (at most "
        "64 characters).",
    )
    expression: str = Field(
        min_length=1,
        max_length=256,
        description="rate(N minute|minutes|hour|hours|day|days) or cron(minutes hours day-of-month month "
        "day-of-week "
        "year), as EventBridge Scheduler reads them. Locally only rate(…) schedules fire.",
    )
    ref: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The ref to build; default: the project's default_ref.",
    )
    stages: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="Run only these stages of the project; default: all of them.",
    )
    timezone: str = Field(
        default="UTC",
        max_length=64,
        pattern=_TIMEZONE.pattern,
        description="The time zone of a cron(…) expression, e.g. Europe/Paris.",
    )

    @field_validator("name")
    @classmethod
    def _no_double_dash(cls, name: str) -> str:
        # The Scheduler name is {project_id}--{name}: a "--" here would make it ambiguous.
        if "--" in name:
            raise ValueError("a schedule name may not contain '--'")
        return name

    @field_validator("expression")
    @classmethod
    def _expression(cls, expression: str) -> str:
        return check_schedule_expression(expression)
