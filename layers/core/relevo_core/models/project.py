"""A registered project: what runs, where, and how its webhooks are authenticated."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from enum import Enum
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relevo_core.models.envelope import PROJECT_ID, REGION_AFFINITY
from relevo_core.models.plan import (
    MAX_QUEUE_TIMEOUT_SEC,
    ApprovalSettings,
    RetryPolicy,
    RunPlanMixin,
    StagePlan,
    check_stage_names,
    require_unique,
)


class ProjectStage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    # Sizes of run and effect_probe, and the number of stages, are limits of what a job's
    # execution carries: refused as PLAN_TOO_LARGE (relevo_core.plan_limits), not here.
    run: str = Field(min_length=1)
    exec_timeout_sec: int = Field(default=3600, ge=1, le=86_400)
    kill_grace_sec: int = Field(default=10, ge=0, le=300)
    effect_probe: str | None = None
    inputs: tuple[Annotated[str, Field(min_length=1, max_length=512)], ...] = Field(default=(), max_length=64)


class WebhookSecrets(BaseModel):
    """Where a project's webhook secrets live. Only references are stored, never values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Secrets Manager secret name or ARN holding the GitHub webhook secret.
    github_secret_ref: str | None = Field(default=None, max_length=512)
    gitlab_token_ref: str | None = Field(default=None, max_length=512)


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
        f"{expression!r} is neither rate(N minute|minutes|hour|hours|day|days) nor cron(min hour dom month dow year)"
    )


class ProjectSchedule(BaseModel):
    """A timer that triggers the project: one EventBridge Scheduler schedule per entry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,47}$")
    expression: str = Field(min_length=1, max_length=256)
    # None: the project's default_ref when the schedule fires.
    ref: str | None = Field(default=None, min_length=1, max_length=256)
    stages: list[str] | None = Field(default=None, min_length=1, max_length=32)
    timezone: str = Field(default="UTC", max_length=64, pattern=_TIMEZONE.pattern)

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


class OnRepeat(str, Enum):
    RUN = "run"
    HOLD = "hold"
    SKIP = "skip"


class ForkPolicy(str, Enum):
    """What a pull request from a fork does: its refs/pull/N/head holds commits of someone outside
    the repository, which the project's stages would run on a Mac holding signing identities."""

    IGNORE = "ignore"  # answered 202 ignored, nothing written
    HOLD = "hold"  # a held job, started only when a person releases it after reading the PR
    RUN = "run"  # like any other trigger (forks of trusted collaborators, e.g. a private repo)


class DedupPolicy(BaseModel):
    """How long a trigger of one source counts as the same work, and what a repeat after that does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # None: the source's default, never shorter than the project's longest handoff.
    window_sec: int | None = Field(default=None, ge=60, le=30 * 24 * 3600)
    on_repeat: OnRepeat | None = None


# Defaults per trigger source: (window, on_repeat after the window).
DEDUP_DEFAULTS: dict[str, tuple[int, OnRepeat]] = {
    "webhook": (24 * 3600, OnRepeat.HOLD),
    "schedule": (3600, OnRepeat.RUN),
    "manual": (600, OnRepeat.RUN),
    "api": (600, OnRepeat.RUN),
    "retry": (600, OnRepeat.RUN),
}


class Project(RunPlanMixin):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=PROJECT_ID)
    repo: str = Field(pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$")
    default_ref: str = Field(default="main", min_length=1, max_length=256)
    region_affinity: str = Field(pattern=REGION_AFFINITY)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    stages: tuple[ProjectStage, ...] = Field(min_length=1)
    queue_timeout_sec: int = Field(default=900, ge=1, le=MAX_QUEUE_TIMEOUT_SEC)
    lease_ttl_sec: int = Field(default=60, ge=3, le=3600)
    retry: RetryPolicy = RetryPolicy()
    approval: ApprovalSettings = ApprovalSettings()
    webhook: WebhookSecrets = WebhookSecrets()
    dedup: dict[Literal["webhook", "schedule", "manual", "api", "retry"], DedupPolicy] = Field(default_factory=dict)
    schedules: tuple[ProjectSchedule, ...] = Field(default=(), max_length=32)
    fork_pull_requests: ForkPolicy = ForkPolicy.HOLD

    @property
    def longest_handoff_sec(self) -> int:
        """Queue wait + the longest stage + one lease: how long one stage can take to hand off."""
        return self.queue_timeout_sec + max(stage.exec_timeout_sec for stage in self.stages) + self.lease_ttl_sec

    def dedup_for(self, source: str) -> tuple[int, OnRepeat]:
        default_window, default_on_repeat = DEDUP_DEFAULTS[source]
        policy = self.dedup.get(source, DedupPolicy())  # type: ignore[call-overload]
        window = policy.window_sec if policy.window_sec is not None else default_window
        # A window shorter than a handoff would let a slow job's redelivery start it twice.
        return max(window, self.longest_handoff_sec), policy.on_repeat or default_on_repeat

    @field_validator("stages")
    @classmethod
    def _unique_stage_names(cls, stages: tuple[ProjectStage, ...]) -> tuple[ProjectStage, ...]:
        require_unique([stage.name for stage in stages], "stage")
        return stages

    @field_validator("schedules")
    @classmethod
    def _unique_schedule_names(cls, schedules: tuple[ProjectSchedule, ...]) -> tuple[ProjectSchedule, ...]:
        require_unique([schedule.name for schedule in schedules], "schedule")
        return schedules

    @model_validator(mode="after")
    def _schedule_stages_exist(self) -> "Project":
        known = {stage.name for stage in self.stages}
        for schedule in self.schedules:
            unknown = [name for name in schedule.stages or [] if name not in known]
            if unknown:
                raise ValueError(f"schedule {schedule.name}: stages {', '.join(unknown)} are not stages of the project")
        return self

    def schedule(self, name: str) -> ProjectSchedule | None:
        return next((schedule for schedule in self.schedules if schedule.name == name), None)

    def frozen_stages(self) -> tuple[StagePlan, ...]:
        """The project's stages as a job will run them: the plan is copied, never referenced."""
        return check_stage_names(
            tuple(
                StagePlan(
                    name=stage.name,
                    command=stage.run,
                    exec_timeout_sec=stage.exec_timeout_sec,
                    kill_grace_sec=stage.kill_grace_sec,
                    retry=self.retry,
                    effect_probe=stage.effect_probe,
                    inputs=stage.inputs,
                )
                for stage in self.stages
            )
        )
