"""Environment of each component, validated once at cold start (pydantic models)."""

from __future__ import annotations

import os
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field


class _Env(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    @classmethod
    def from_environ(cls):  # type: ignore[no-untyped-def]
        return cls.model_validate(dict(os.environ))


class TableSettings(_Env):
    table_name: str = Field(alias="TABLE_NAME", min_length=3)
    job_retention_days: int = Field(default=30, alias="JOB_RETENTION_DAYS", ge=1)


class IntakeSettings(TableSettings):
    state_machine_arn: str = Field(alias="STATE_MACHINE_ARN")
    artifact_bucket: str = Field(alias="ARTIFACT_BUCKET")
    work_queue_prefix: str = Field(alias="WORK_QUEUE_PREFIX")
    queue_limit: int = Field(default=50, alias="QUEUE_LIMIT", ge=1)
    # How long a fetched webhook secret is reused before it is read again.
    secret_max_age_sec: int = Field(default=300, alias="SECRET_MAX_AGE_SEC", ge=0)


@lru_cache(maxsize=1)
def table_settings() -> TableSettings:
    return TableSettings.from_environ()


@lru_cache(maxsize=1)
def intake_settings() -> IntakeSettings:
    return IntakeSettings.from_environ()
