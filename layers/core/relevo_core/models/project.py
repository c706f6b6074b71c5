"""A registered project: what runs, where, and how its webhooks are authenticated."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, field_validator

from relevo_core.models.envelope import PROJECT_ID, REGION_AFFINITY
from relevo_core.models.plan import ApprovalSettings, RetryPolicy, RunPlanMixin, StagePlan, check_stage_names


class ProjectStage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    run: str = Field(min_length=1, max_length=16_384)
    exec_timeout_sec: int = Field(default=3600, ge=1, le=86_400)
    effect_probe: str | None = Field(default=None, max_length=16_384)


class WebhookSecrets(BaseModel):
    """Where a project's webhook secrets live. Only references are stored, never values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Secrets Manager secret name or ARN holding the GitHub webhook secret.
    github_secret_ref: str | None = Field(default=None, max_length=512)
    gitlab_token_ref: str | None = Field(default=None, max_length=512)


class OnRepeat(str, Enum):
    RUN = "run"
    HOLD = "hold"
    SKIP = "skip"


class Project(RunPlanMixin):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=PROJECT_ID)
    repo: str = Field(pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$")
    default_ref: str = Field(default="main", min_length=1, max_length=256)
    region_affinity: str = Field(pattern=REGION_AFFINITY)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    stages: tuple[ProjectStage, ...] = Field(min_length=1, max_length=32)
    queue_timeout_sec: int = Field(default=900, ge=1, le=86_400)
    lease_ttl_sec: int = Field(default=60, ge=3, le=3600)
    retry: RetryPolicy = RetryPolicy()
    approval: ApprovalSettings = ApprovalSettings()
    webhook: WebhookSecrets = WebhookSecrets()

    @field_validator("stages")
    @classmethod
    def _unique_stage_names(cls, stages: tuple[ProjectStage, ...]) -> tuple[ProjectStage, ...]:
        names = [stage.name for stage in stages]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"stage names must be unique, repeated: {', '.join(duplicates)}")
        return stages

    def frozen_stages(self) -> tuple[StagePlan, ...]:
        """The project's stages as a job will run them: the plan is copied, never referenced."""
        return check_stage_names(
            tuple(
                StagePlan(
                    name=stage.name,
                    command=stage.run,
                    exec_timeout_sec=stage.exec_timeout_sec,
                    retry=self.retry,
                    effect_probe=stage.effect_probe,
                )
                for stage in self.stages
            )
        )
