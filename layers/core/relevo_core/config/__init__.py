"""Environment of each component, validated once at cold start (pydantic models).

Here: the settings several functions share. Those of one function only are in submodules
(config.sweeper, config.scheduler, config.queue): a function does not build at its cold start the
models of settings it never reads."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

import os
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Self

from pydantic import BaseModel, ConfigDict, Field


class _Env(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    @classmethod
    def from_environ(cls) -> Self:
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


class FleetRegions(_Env):
    """The fleet's region affinities (the template's RegionAffinities, comma-separated)."""

    fleet_regions: str = Field(default="", alias="FLEET_REGIONS", max_length=4096)

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(r.strip() for r in self.fleet_regions.split(",") if r.strip())


class AccessSettings(TableSettings):
    """What the permission check of every IAM route reads besides the grants in the table."""

    # Comma-separated principals (ARNs or `.../*` patterns) with `manage` on every project.
    admin_principals: str = Field(default="", alias="ADMIN_PRINCIPALS", max_length=4096)

    @property
    def admins(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.admin_principals.split(",") if p.strip())


class ExecutionSettings(TableSettings):
    """What starting or stopping a job's execution reads: the state machines, and the queue limit
    whose slot a job takes (intake) or gives back (cancel).

    A job's execution, named by its job id, runs one of two machines: JobStateMachine when intake
    took the project's lock with the job (its stages at once, the common case), else
    JobQueuedStateMachine, which takes the lock or waits for it first (store/keys.MACHINE_ATTRIBUTE)."""

    state_machine_arn: str = Field(alias="STATE_MACHINE_ARN")
    queued_state_machine_arn: str = Field(alias="QUEUED_STATE_MACHINE_ARN")
    queue_limit: int = Field(default=50, alias="QUEUE_LIMIT", ge=1)

    @property
    def machines(self) -> tuple[str, str]:
        """Where a job's execution may be, the common machine first."""
        return (self.state_machine_arn, self.queued_state_machine_arn)


class IntakeSettings(ExecutionSettings):
    artifact_bucket: str = Field(alias="ARTIFACT_BUCKET")
    work_queue_prefix: str = Field(alias="WORK_QUEUE_PREFIX")
    # How long a fetched webhook secret is reused before it is read again.
    secret_max_age_sec: int = Field(default=300, alias="SECRET_MAX_AGE_SEC", ge=0)
    # How long a project read is reused by intake (a change reaches webhooks within this).
    project_cache_sec: float = Field(default=10, alias="PROJECT_CACHE_SEC", ge=0)
    # How long a project whose lock refused a job is written queued at once (intake.busy_projects;
    # 0: its lock is tried for every job).
    busy_project_memory_sec: float = Field(default=10, alias="BUSY_PROJECT_MEMORY_SEC", ge=0)
    # How long a webhook delivery's record (relevo delivery list) is kept.
    delivery_record_days: int = Field(default=14, alias="DELIVERY_RECORD_DAYS", ge=1, le=365)


@lru_cache(maxsize=1)
def table_settings() -> TableSettings:
    return TableSettings.from_environ()


@lru_cache(maxsize=1)
def access_settings() -> AccessSettings:
    return AccessSettings.from_environ()


@lru_cache(maxsize=1)
def execution_settings() -> ExecutionSettings:
    return ExecutionSettings.from_environ()


@lru_cache(maxsize=1)
def intake_settings() -> IntakeSettings:
    return IntakeSettings.from_environ()
