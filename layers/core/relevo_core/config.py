"""Environment of each component, validated once at cold start (pydantic models)."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

import os
import re
from datetime import datetime, timedelta
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, field_validator

from relevo_core.models.envelope import REGION_AFFINITY


class _Env(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    @classmethod
    def from_environ(cls):  # type: ignore[no-untyped-def]
        return cls.model_validate(dict(os.environ))


class TableSettings(_Env):
    table_name: str = Field(alias="TABLE_NAME", min_length=3)
    # Retention (template parameters JobRetentionDays, LogRetentionDays), frozen into each new
    # job's envelope as `ttl` and `log_ttl`: DynamoDB TTL expires the records, no code does.
    job_retention_days: int = Field(default=30, alias="JOB_RETENTION_DAYS", ge=1)
    log_retention_days: int = Field(default=14, alias="LOG_RETENTION_DAYS", ge=1)

    def expiry(self, created_at: datetime) -> dict[str, int]:
        """A new job's `ttl` and `log_ttl` (epoch seconds), counted from its creation."""
        return {
            "ttl": int((created_at + timedelta(days=self.job_retention_days)).timestamp()),
            "log_ttl": int((created_at + timedelta(days=self.log_retention_days)).timestamp()),
        }


class AccessSettings(TableSettings):
    """What the permission check of every IAM route reads besides the grants in the table."""

    # Comma-separated principals (ARNs or `.../*` patterns) with `manage` on every project.
    admin_principals: str = Field(default="", alias="ADMIN_PRINCIPALS", max_length=4096)

    @property
    def admins(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.admin_principals.split(",") if p.strip())


class IntakeSettings(TableSettings):
    state_machine_arn: str = Field(alias="STATE_MACHINE_ARN")
    artifact_bucket: str = Field(alias="ARTIFACT_BUCKET")
    work_queue_prefix: str = Field(alias="WORK_QUEUE_PREFIX")
    queue_limit: int = Field(default=50, alias="QUEUE_LIMIT", ge=1)
    # How long a fetched webhook secret is reused before it is read again.
    secret_max_age_sec: int = Field(default=300, alias="SECRET_MAX_AGE_SEC", ge=0)
    # How long a project read is reused by intake (a change reaches webhooks within this).
    project_cache_sec: float = Field(default=10, alias="PROJECT_CACHE_SEC", ge=0)


class SweeperSettings(IntakeSettings):
    # Where the owner hears that an idempotency key was frozen (the project notification topic).
    notification_topic_arn: str = Field(alias="NOTIFICATION_TOPIC_ARN", pattern=r"^arn:[a-z-]+:sns:")
    # The stack's region affinities (the RegionAffinities parameter, comma-separated): each one's
    # online agents are counted every sweep, an empty region included.
    regions: tuple[str, ...] = Field(alias="REGION_AFFINITIES", min_length=1)

    @field_validator("regions", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(region.strip() for region in value.split(",") if region.strip())
        return value

    @field_validator("regions")
    @classmethod
    def _affinities(cls, regions: tuple[str, ...]) -> tuple[str, ...]:
        for region in regions:
            if not re.fullmatch(REGION_AFFINITY, region):
                raise ValueError(f"{region!r} is not a region affinity")
        return regions


class SchedulerSettings(_Env):
    """Where the registry keeps project schedules (EventBridge Scheduler) and what they invoke."""

    schedule_group: str = Field(alias="SCHEDULE_GROUP", min_length=1, max_length=64)
    schedule_target_arn: str = Field(alias="SCHEDULE_TARGET_ARN", pattern=r"^arn:[a-z-]+:lambda:")
    scheduler_role_arn: str = Field(alias="SCHEDULER_ROLE_ARN", pattern=r"^arn:[a-z-]+:iam::")


@lru_cache(maxsize=1)
def table_settings() -> TableSettings:
    return TableSettings.from_environ()


@lru_cache(maxsize=1)
def access_settings() -> AccessSettings:
    return AccessSettings.from_environ()


@lru_cache(maxsize=1)
def intake_settings() -> IntakeSettings:
    return IntakeSettings.from_environ()


@lru_cache(maxsize=1)
def sweeper_settings() -> SweeperSettings:
    return SweeperSettings.from_environ()


@lru_cache(maxsize=1)
def scheduler_settings() -> SchedulerSettings:
    return SchedulerSettings.from_environ()


class QueueSettings(AccessSettings):
    """GET /queue: besides the table and the admins, the regions of the fleet (whose agents it shows)."""

    # Comma-separated region affinities (the template's RegionAffinities).
    fleet_regions: str = Field(default="", alias="FLEET_REGIONS", max_length=4096)

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(r.strip() for r in self.fleet_regions.split(",") if r.strip())


@lru_cache(maxsize=1)
def queue_settings() -> QueueSettings:
    return QueueSettings.from_environ()
