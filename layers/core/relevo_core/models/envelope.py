"""The job envelope: the versioned, immutable record of one job and its frozen run plan."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

import os
import time
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from relevo_core.models.build_number import BuildNumberSettings
from relevo_core.models.checkout_plan import CheckoutPlan
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.plan import (
    MAX_QUEUE_TIMEOUT_SEC,
    STAGE_NAME,
    ApprovalSettings,
    RunPlanMixin,
    SigningPlan,
    StagePlan,
    check_stage_names,
)
from relevo_core.models.shapes import JOB_ID, PRIORITY_BOUND, PROJECT_ID, REGION_AFFINITY

# Bump when a reader written for the old version would misread the new one.
# 2 added `log_ttl`. A reader that knows only 1 refuses a 2 with ENVELOPE_VERSION_UNSUPPORTED,
# not a VALIDATION_FAILED about an unknown field; a 1 still reads (its logs expire with the job).
# 3 added a stage's `aws_profile`: an agent that would ignore it must not run the stage without it.
# 4 added `checkout` and a stage's `handoff`: an agent that would ignore them would run a stage on
# whatever its workspace held, without the files the earlier stages handed on.
# 5 added a stage's `warning_exit_codes`: an agent that would ignore them would fail a stage that
# exits with one.
# 6 added a stage's `effect_resume` and the job's `build_number`: an agent that would ignore
# them would hold for a person every effect its probe finds in progress, or run a stage that needs
# the job's build number (RELEVO_BUILD_NUMBER) without one.
# 7 added a stage's `effect` (a built-in release effect, no command): an agent that would ignore it
# would run nothing and report the stage succeeded without the effect.
# 8 added a stage's `caches` and the job's `cache_write`: an agent that would ignore them would
# run the stage without what it restores, or save what this job's ref may not write. 8 also
# carries a stage's `tests` (added in the same release): an agent that would ignore them would pass
# a shard that ran none of its planned tests.
ENVELOPE_SCHEMA_VERSION = 8
SUPPORTED_SCHEMA_VERSIONS = frozenset({1, 2, 3, 4, 5, 6, 7, 8})


class TriggerType(str, Enum):
    MANUAL = "manual"
    API = "api"
    RETRY = "retry"
    SCHEDULE = "schedule"
    WEBHOOK = "webhook"


class Trigger(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: TriggerType
    # Where it came from: github, gitlab, cli, api, scheduler, ...
    source: str = Field(min_length=1, max_length=64)
    delivery_id: str | None = Field(default=None, max_length=128)
    actor: str | None = Field(default=None, max_length=512)


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("created_at must carry a time zone")
    return value.astimezone(UTC)


class JobEnvelope(RunPlanMixin):
    """Everything needed to run, resume or audit a job, frozen when the job is enqueued."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = ENVELOPE_SCHEMA_VERSION
    job_id: str = Field(pattern=JOB_ID)
    idempotency_key: str = Field(min_length=1, max_length=512)
    project: str = Field(pattern=PROJECT_ID)
    region_affinity: str = Field(pattern=REGION_AFFINITY)
    artifact_uri: str = Field(pattern=r"^s3://[a-z0-9.-]{3,63}/.*$")
    created_at: Annotated[datetime, AfterValidator(_utc)]
    # Epoch seconds after which DynamoDB may expire the record, and with it the job's artifact
    # records (JobRetentionDays after created_at).
    ttl: int = Field(gt=0, lt=10**11)
    # Epoch seconds after which the job's log chunks may expire (LogRetentionDays after
    # created_at). None in envelopes written before it existed: their logs expire with the job.
    log_ttl: int | None = Field(default=None, gt=0, lt=10**11)
    trigger: Trigger
    priority: int = Field(default=0, ge=-PRIORITY_BOUND, le=PRIORITY_BOUND)
    ref: str = Field(min_length=1, max_length=256)
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,64}$")
    stages: tuple[StagePlan, ...] = Field(min_length=1, max_length=32)
    queue_timeout_sec: int = Field(default=900, ge=1, le=MAX_QUEUE_TIMEOUT_SEC)
    exec_timeout_sec: int = Field(default=3600, ge=1, le=86_400)
    lease_ttl_sec: int = Field(default=60, ge=3, le=3600)
    approval: ApprovalSettings = ApprovalSettings()
    from_stage: str | None = Field(default=None, pattern=STAGE_NAME)
    retry_of: str | None = Field(default=None, pattern=r"^job_[0-9a-z]{20,40}$")
    # The project's workspace_cleanup, run by the agent once idle after the job's stages.
    workspace_cleanup: str | None = Field(default=None, max_length=4096)
    # The project's artifact.max_job_bytes (None: no bound).
    artifact_max_job_bytes: int | None = Field(default=None, ge=1)
    # The project's signing settings (a temporary keychain per stage on the agent), frozen like
    # `requires`: a change to the project does not reach a job already enqueued.
    signing: SigningPlan | None = None
    # The project's checkout (the agent makes each stage's workspace the job's commit), frozen too.
    checkout: CheckoutPlan | None = None
    # For a job from a later stage: the last of the skipped stages that succeeded in the job it
    # retries (relevo_core.jobs.lineage), its last successful stage until one of its own succeeds.
    stands_on: str | None = Field(default=None, pattern=STAGE_NAME)
    # The project's build_number settings, frozen too: the stages that need a build number, the floor.
    build_number: BuildNumberSettings | None = None
    # Whether this job saves the project's caches: its ref is one the project trusts (its default
    # branch, or cache_write_refs; never a pull request's). The job session's `cache_write` tag
    # says the same to IAM (relevo_core.fleet.job_credentials): the agent's word is not the bound.
    cache_write: bool = False

    @field_validator("stages")
    @classmethod
    def _unique_stage_names(cls, stages: tuple[StagePlan, ...]) -> tuple[StagePlan, ...]:
        return check_stage_names(stages)

    def stage(self, name: str) -> StagePlan:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    @property
    def log_expires_at(self) -> int:
        """The TTL every log chunk of the job carries."""
        return self.ttl if self.log_ttl is None else self.log_ttl

    @property
    def first_stage_index(self) -> int:
        """Where the job starts: 0, or the index of from_stage."""
        if self.from_stage is None:
            return 0
        return [stage.name for stage in self.stages].index(self.from_stage)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def read_envelope(data: dict[str, Any]) -> JobEnvelope:
    """Parse an envelope from any source, refusing versions this reader does not know.

    The version is checked before anything else so that a newer envelope never half-parses into
    an older model.
    """
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version not in SUPPORTED_SCHEMA_VERSIONS:
        raise RelevoError(
            ErrorCode.ENVELOPE_VERSION_UNSUPPORTED,
            f"envelope schema_version {version!r} is not supported; this reader knows "
            f"{sorted(SUPPORTED_SCHEMA_VERSIONS)}",
            schema_version=version if isinstance(version, (int, str)) else None,
        )
    try:
        return JobEnvelope.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc


def validation_error(exc: ValidationError) -> RelevoError:
    """A VALIDATION_FAILED refusal whose message names each offending field."""
    problems = [
        {"field": ".".join(str(part) for part in error["loc"]) or "(root)", "problem": error["msg"]}
        for error in exc.errors(include_url=False)
    ]
    named = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
    return RelevoError(ErrorCode.VALIDATION_FAILED, named, problems=problems)


def new_job_id(now: float | None = None) -> str:
    """A job id that sorts by creation time: 10 base-36 chars of milliseconds, then randomness."""
    millis = int((time.time() if now is None else now) * 1000)
    return (
        "job_"
        + _base36(millis).rjust(10, "0")
        + _base36(int.from_bytes(os.urandom(10), "big")).rjust(16, "0")
    )


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        number, rest = divmod(number, 36)
        out = digits[rest] + out
        if number == 0:
            return out
