"""A project's settings besides its stages and schedules: the bounds on its artifacts, where its
webhook secrets live, where its jobs report their status, how a repeat of the same work is told
apart, and what a pull request from a fork does."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ArtifactLimits(BaseModel):
    """Bounds on what a project's jobs store (issue 20)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_job_bytes: int | None = Field(
        default=None,
        ge=1,
        le=5 * 10**12,
        description="The most one job's artifacts may total: a stage whose files would take the job past it "
        "fails "
        "with Relevo.Fatal.ArtifactQuota before anything is uploaded. Default: no bound.",
    )
    max_total_bytes: int | None = Field(
        default=None,
        ge=1,
        le=10**15,
        description="The most the project's stored artifacts may total: past it, the artifacts of the "
        "oldest ended jobs are "
        "removed (their objects deleted, their records kept and marked removed by quota, each removal in "
        "the job's audit "
        "trail) until the total is back within it. Artifacts of live jobs are never removed. Default: no "
        "bound.",
    )


class WebhookSecrets(BaseModel):
    """Where a project's webhook secrets live. Only references are stored, never values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    github_secret_ref: str | None = Field(
        default=None, max_length=512, description="Secrets Manager name or ARN of the GitHub webhook secret."
    )
    gitlab_token_ref: str | None = Field(
        default=None, max_length=512, description="Secrets Manager name or ARN of the GitLab webhook token."
    )


class GitHubAppSettings(BaseModel):
    """A GitHub App the status reporter acts as: Check Runs instead of commit statuses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    app_id: int = Field(ge=1, description="The App's id (its settings page, About).")
    installation_id: int = Field(
        ge=1, description="Its installation on the repository's account (the installation's URL ends in it)."
    )
    private_key_ref: str = Field(
        min_length=1,
        max_length=512,
        pattern=r"^relevo/[A-Za-z0-9-]+/_status/[A-Za-z0-9/_+=.@-]+$",
        description="Secrets Manager name of the App's private key (PEM), under relevo/<stack>/_status/.",
    )


class CommitStatusSettings(BaseModel):
    """Where a project's jobs report their status back to the commit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: Literal["github", "gitlab"] = Field(
        description="github: a commit status (context relevo/<project>); gitlab: a commit status through "
        "GitLab's API."
    )
    token_ref: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=r"^relevo/[A-Za-z0-9-]+/_status/[A-Za-z0-9/_+=.@-]+$",
        description="Secrets Manager name of the token (GitHub: a token with commit statuses write; GitLab: "
        "a project "
        "access token with the api scope), under relevo/<stack>/_status/ (no project id starts with _): the "
        "reporter may read nothing else.",
    )
    api_url: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        description="The API's base URL; default https://api.github.com (GitHub) or "
        "https://gitlab.com/api/v4 (GitLab). "
        "Set it for GitHub Enterprise Server or a self-managed GitLab.",
    )
    gitlab_project: str | None = Field(
        default=None,
        max_length=256,
        description="GitLab only: the project's numeric id or its path; default: the project's repo.",
    )

    app: GitHubAppSettings | None = Field(
        default=None,
        description="GitHub only, instead of token_ref: report as this GitHub App, with Check Runs (a "
        "summary per stage).",
    )

    @model_validator(mode="after")
    def _one_credential(self) -> "CommitStatusSettings":
        if self.provider == "gitlab" and (self.app is not None or self.token_ref is None):
            raise ValueError("gitlab reports with a project access token: token_ref, and no app")
        if self.provider == "github" and (self.app is None) == (self.token_ref is None):
            raise ValueError(
                "github reports with either a token (token_ref) or an App (app), exactly one of them"
            )
        return self

    def base_url(self) -> str:
        default = "https://api.github.com" if self.provider == "github" else "https://gitlab.com/api/v4"
        return (self.api_url or default).rstrip("/")


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

    window_sec: int | None = Field(
        default=None,
        ge=60,
        le=30 * 24 * 3600,
        description="How long the same work again is answered as a duplicate of the first job. Default: "
        "webhook 24 h, "
        "schedule 1 h, manual, api and retry 10 min; never shorter than the project's longest handoff "
        "(queue_timeout_sec + the longest exec_timeout_sec + lease_ttl_sec).",
    )
    on_repeat: OnRepeat | None = Field(
        default=None,
        description="What the same work after the window does: run (a new job), hold (a held job, started by "
        "`relevo job release`) or skip. Default: hold for webhooks, run for the others.",
    )


# Defaults per trigger source: (window, on_repeat after the window).
DEDUP_DEFAULTS: dict[str, tuple[int, OnRepeat]] = {
    "webhook": (24 * 3600, OnRepeat.HOLD),
    "schedule": (3600, OnRepeat.RUN),
    "manual": (600, OnRepeat.RUN),
    "api": (600, OnRepeat.RUN),
    "retry": (600, OnRepeat.RUN),
}
