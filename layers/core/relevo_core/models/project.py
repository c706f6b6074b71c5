"""A registered project: what runs, where, and how its webhooks are authenticated."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

import re
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relevo_core.models.capabilities import MAX_REQUIREMENTS, Requirements
from relevo_core.models.handoff import MAX_PATTERNS, shard_variable_part, variable_part
from relevo_core.models.plan import (
    AWS_PROFILE,
    MAX_DECLARED_SHARDS,
    MAX_MATRIX_KEYS,
    MAX_QUEUE_TIMEOUT_SEC,
    ApprovalSettings,
    CheckoutPlan,
    HandoffPattern,
    Matrix,
    RetryPolicy,
    RunPlanMixin,
    SigningPlan,
    StagePlan,
    check_fan_out,
    check_handoff_patterns,
    check_stage_names,
    require_unique,
    shard_count,
)
from relevo_core.models.shapes import PROJECT_ID, REGION_AFFINITY


class ProjectStage(BaseModel):
    """One stage: a command run on one agent of the project's region."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        pattern=r"^[a-z][a-z0-9_-]{0,62}$",
        description="Unique in the project: a lowercase letter, then lowercase letters, digits, _ and -.",
    )
    run: str = Field(
        min_length=1,
        description="The command (at most 16 KiB, refused as PLAN_TOO_LARGE): `bash -c` in the project's workspace on the agent, in its own process group, with "
        "RELEVO_JOB_ID, RELEVO_STAGE, RELEVO_REF, RELEVO_COMMIT, RELEVO_ATTEMPT, RELEVO_OPERATION_ID, RELEVO_WORKSPACE "
        "and RELEVO_ARTIFACT_DIR set (and RELEVO_KEYCHAIN, the path of the stage's signing keychain, when the project sets signing). "
        "Files left in $RELEVO_ARTIFACT_DIR are uploaded as the stage's artifacts.",
    )
    exec_timeout_sec: int = Field(
        default=3600,
        ge=1,
        le=86_400,
        description="How long the command may run; then the agent stops it and the attempt fails with Relevo.Timeout.Exec.",
    )
    kill_grace_sec: int = Field(
        default=10,
        ge=0,
        le=300,
        description="Seconds between SIGTERM and SIGKILL to the stage's process group when it is stopped.",
    )
    effect_probe: str | None = Field(
        default=None,
        description="A read-only command (at most 16 KiB) telling whether the stage's effect already exists, run before an attempt "
        "whose previous outcome is unknown is run again: exit 0 with $RELEVO_OPERATION_ID in its output means it "
        "does (the stage is reconciled as succeeded), exit 1 that it does not.",
    )
    inputs: tuple[Annotated[str, Field(min_length=1, max_length=512)], ...] = Field(
        default=(),
        max_length=64,
        description="Workspace-relative globs whose contents, with the commit, are the stage's precondition: when "
        "they change between attempts, reconciliation stops with Relevo.Precondition.Changed.",
    )
    aws_profile: str | None = Field(
        default=None,
        pattern=AWS_PROFILE,
        description="The build user's AWS profile this stage runs with (AWS_PROFILE in its environment); the stage "
        "never sees the agent's own credentials.",
    )
    requires: Requirements = Field(
        default_factory=dict,
        max_length=MAX_REQUIREMENTS,
        description='What the agent must have to claim this stage, as `key: glob`, e.g. `{xcode: "16.*", arch: arm64}`: '
        "`xcode` is the selected Xcode's version, `macos` the macOS version, `arch` the CPU architecture, `os` darwin or "
        "linux; any other key is a label of the agent's TOML. Frozen into each job's plan. No agent of the region "
        "matching: the job waits with queue reason no_matching_agent.",
    )
    handoff: tuple[HandoffPattern, ...] = Field(
        default=(),
        max_length=MAX_PATTERNS,
        description="Workspace-relative paths or globs (`build/App.app`, `build/*.ipa`, `**/*.dSYM`) the stage hands on: "
        "when its command succeeds the agent stores them (files, directories, symlinks, modes and mtimes, each file's "
        "sha256) under the job's artifact_uri, and restores them at the same paths before every later stage of the job, "
        "on whichever Mac, verifying every byte (Relevo.Fatal.Checksum). A path that matches nothing when the command "
        "ends fails the stage (Relevo.Fatal.HandoffMissing). No absolute path, no '..', nothing under .git. On a stage with "
        "shards, each shard hands on its own: a later stage restores every shard's, and two shards handing on one path "
        "differently fail it (Relevo.Fatal.HandoffConflict, naming both). See docs/handoff.md.",
    )
    warning_exit_codes: tuple[Annotated[int, Field(ge=1, le=255)], ...] = Field(
        default=(),
        max_length=32,
        description='Non-zero exit codes that mean "succeeded, with warnings" (e.g. a linter\'s 3): the stage ends '
        "`warning` and the job goes on as after a success, its artifacts and handoff stored. A line the command prints "
        "starting `::warning::` (GitHub Actions' spelling) makes a stage that exits 0 end `warning` too. `relevo job "
        "view`, `relevo job logs`, the console and the commit status say so. None may be a retry.transient_exit_codes code.",
    )
    parallel: int | None = Field(
        default=None,
        ge=2,
        le=MAX_DECLARED_SHARDS,
        description="Run the stage as this many shards at once, each an attempt of its own on an agent of the region (its own "
        "claim, lease, retries and reconcile), with RELEVO_SHARD_INDEX (0-based) and RELEVO_SHARD_COUNT set. How many shards "
        "a job may run in all is checked at `relevo project apply` (PLAN_TOO_LARGE). Exclusive with matrix. Each shard's "
        "values reach later stages as RELEVO_OUT_<STAGE>_SHARD<k>_<KEY>.",
    )
    matrix: Matrix | None = Field(
        default=None,
        max_length=MAX_MATRIX_KEYS,
        description='Run one shard per combination of these values, e.g. `{device: ["iPhone 16", "iPad Air"], os: ["18.2"]}`, '
        "each with RELEVO_MATRIX_<KEY> (the key upper-cased) and RELEVO_SHARD_INDEX / RELEVO_SHARD_COUNT set. Keys: lowercase "
        "letters, digits and _ (at most 4); values: 1 to 64 characters (at most 64 per key). Exclusive with parallel.",
    )
    fail_fast: bool | None = Field(
        default=None,
        description="With parallel or matrix (default true): the first shard that fails for good stops its running siblings "
        "(their process groups are killed and they end canceled) and fails the stage. false: the others run to their end, "
        "then the stage fails if any shard did.",
    )
    max_parallel: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DECLARED_SHARDS,
        description="With parallel or matrix: at most this many shards run at once (default: all of them); the others start "
        "as earlier ones end. At most 40 of a stage's shards run at once (a Step Functions inline Map's limit): a stage of "
        "more than 40 shards must set it to 40 or less, or be split; `relevo project apply` refuses it otherwise "
        "(PLAN_TOO_LARGE).",
    )

    @field_validator("handoff")
    @classmethod
    def _handoff(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        return check_handoff_patterns(patterns)

    @model_validator(mode="after")
    def _fan_out(self) -> "ProjectStage":
        check_fan_out(self.parallel, self.matrix, self.fail_fast, self.max_parallel)
        return self


class ArtifactLimits(BaseModel):
    """Bounds on what a project's jobs store (issue 20)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_job_bytes: int | None = Field(
        default=None,
        ge=1,
        le=5 * 10**12,
        description="The most one job's artifacts may total: a stage whose files would take the job past it fails "
        "with Relevo.Fatal.ArtifactQuota before anything is uploaded. Default: no bound.",
    )
    max_total_bytes: int | None = Field(
        default=None,
        ge=1,
        le=10**15,
        description="The most the project's stored artifacts may total: past it, the artifacts of the oldest ended jobs are "
        "removed (their objects deleted, their records kept and marked removed by quota, each removal in the job's audit "
        "trail) until the total is back within it. Artifacts of live jobs are never removed. Default: no bound.",
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
        description="github: a commit status (context relevo/<project>); gitlab: a commit status through GitLab's API."
    )
    token_ref: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=r"^relevo/[A-Za-z0-9-]+/_status/[A-Za-z0-9/_+=.@-]+$",
        description="Secrets Manager name of the token (GitHub: a token with commit statuses write; GitLab: a project "
        "access token with the api scope), under relevo/<stack>/_status/ (no project id starts with _): the reporter may read nothing else.",
    )
    api_url: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        description="The API's base URL; default https://api.github.com (GitHub) or https://gitlab.com/api/v4 (GitLab). "
        "Set it for GitHub Enterprise Server or a self-managed GitLab.",
    )
    gitlab_project: str | None = Field(
        default=None,
        max_length=256,
        description="GitLab only: the project's numeric id or its path; default: the project's repo.",
    )

    app: GitHubAppSettings | None = Field(
        default=None,
        description="GitHub only, instead of token_ref: report as this GitHub App, with Check Runs (a summary per stage).",
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

    name: str = Field(
        pattern=r"^[a-z][a-z0-9-]{0,47}$",
        description="Unique in the project, without '--'; the Scheduler entry is <project>--<name> (at most 64 characters).",
    )
    expression: str = Field(
        min_length=1,
        max_length=256,
        description="rate(N minute|minutes|hour|hours|day|days) or cron(minutes hours day-of-month month day-of-week "
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
        description="How long the same work again is answered as a duplicate of the first job. Default: webhook 24 h, "
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


class Project(RunPlanMixin):
    """A registered project: its repository, its stages and where they run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(
        pattern=PROJECT_ID,
        description="The project's id: lowercase letters, digits and -, at most 63. It names the project in every "
        "command, in its webhook URL (/webhooks/github/<id>) and in its secrets' names.",
    )
    repo: str = Field(
        pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$",
        description="The Git repository as its webhooks name it (owner/name; GitLab: group/…/name). Deliveries from "
        "another repository are ignored.",
    )
    group: str | None = Field(
        default=None,
        pattern=PROJECT_ID,
        description="The project group it belongs to (lowercase letters, digits and -): the console's run page and "
        "`GET /jobs?group=` filter by it, and a group's notification channels serve every project in it.",
    )
    default_ref: str = Field(
        default="main",
        min_length=1,
        max_length=256,
        description="The ref a run or a schedule builds when it names none.",
    )
    region_affinity: str = Field(
        pattern=REGION_AFFINITY,
        description="Which Macs run the stages: the agents of this region affinity, one of the stack's RegionAffinities "
        "(`relevo project apply` refuses one the stack has no work queue for). A name of the fleet's own (eu-west, "
        "office-berlin), not an AWS region: the stack's AWS region (eu-west-1) holds every region affinity's work queue.",
    )
    priority: int = Field(
        default=0,
        ge=-1_000_000,
        le=1_000_000,
        description="Priority of the project's webhook and schedule jobs; higher runs first (relevo project run defaults to 10, the API to 0).",
    )
    stages: tuple[ProjectStage, ...] = Field(
        min_length=1,
        description="The stages (1 to 32, more is refused as PLAN_TOO_LARGE), run one after another, each on one agent of the region.",
    )
    queue_timeout_sec: int = Field(
        default=900,
        ge=1,
        le=MAX_QUEUE_TIMEOUT_SEC,
        description="How long a stage waits on the region's queue for an agent to claim it, and a job for its "
        "project's lock while another job of the project runs (not while that job waits at its approval gate); then the "
        "attempt fails with Relevo.Timeout.Queue.",
    )
    lease_ttl_sec: int = Field(
        default=60,
        ge=3,
        le=3600,
        description="The lease an agent holds on a stage it runs, renewed every lease/3; when it lapses (the agent "
        "died or lost the network) the attempt fails with Relevo.Lease.Expired and is retried.",
    )
    artifact: ArtifactLimits = Field(
        default=ArtifactLimits(), description="Bounds on the artifacts of the project's jobs."
    )
    workspace_cleanup: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="A command the agent runs in the project's workspace after its stages, between stages and never "
        "during one (once the agent is idle), e.g. `rm -rf ~/Library/Developer/Xcode/DerivedData/*`; bounded by the "
        "agent's cleanup_timeout_sec. Frozen into each job.",
    )
    signing: SigningPlan | None = Field(
        default=None,
        description="Opt-in: a temporary signing keychain for each stage of the project's jobs, with the identities "
        "named here imported from Secrets Manager (macOS agents only; see signing.keychain). Each ref must be under "
        "relevo/<stack>/_signing/<region_affinity>/<id>/ of this project: the region's agents may read that and "
        "nothing wider. Frozen into each job. Default: none.",
    )
    checkout: CheckoutPlan | None = Field(
        default=None,
        description="Opt-in: before each stage's command the agent makes the workspace the job's commit (a per-Mac "
        "mirror, a bounded fetch, a forced checkout, git clean), so every stage, retry and rerun builds the same commit "
        "even if the branch moves. The commit is the trigger's; else the first checkout resolves the ref and records "
        "it on the job. Frozen into each job. Without it the workspace is whatever the agent's earlier stages left "
        "(RELEVO_COMMIT is then the trigger's commit, or empty). See docs/handoff.md.",
    )
    retry: RetryPolicy = Field(
        default=RetryPolicy(), description="How failures of the project's stages are classified and retried."
    )
    approval: ApprovalSettings = Field(
        default=ApprovalSettings(), description="An approval gate before one stage."
    )
    webhook: WebhookSecrets = Field(
        default=WebhookSecrets(),
        description="Where the webhook secrets are stored (references only; `relevo project apply` fills them in).",
    )
    dedup: dict[Literal["webhook", "schedule", "manual", "api", "retry"], DedupPolicy] = Field(
        default_factory=dict,
        description="Per trigger source (webhook, schedule, manual, api, retry): how long the same work counts as "
        "one job, and what it does after that.",
    )
    schedules: tuple[ProjectSchedule, ...] = Field(
        default=(),
        max_length=32,
        description="Timers that run the project (EventBridge Scheduler entries, kept by `relevo project apply`).",
    )
    commit_status: CommitStatusSettings | None = Field(
        default=None,
        description="Report each job's status back to its commit (jobs that name a commit only).",
    )
    console_url: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        description="Where `relevo console` is served for the team: links in statuses and messages point at "
        "<console_url>/jobs/<id> instead of the execution in the Step Functions console.",
    )
    fork_pull_requests: ForkPolicy = Field(
        default=ForkPolicy.HOLD,
        description="What a pull request from a fork does: hold (a held job, started by `relevo job release JOB`), "
        "ignore, or run (for trusted forks).",
    )

    @property
    def longest_handoff_sec(self) -> int:
        """Queue wait + the longest stage + one lease: how long one stage can take to hand off."""
        return (
            self.queue_timeout_sec + max(stage.exec_timeout_sec for stage in self.stages) + self.lease_ttl_sec
        )

    def dedup_for(self, source: str) -> tuple[int, OnRepeat]:
        default_window, default_on_repeat = DEDUP_DEFAULTS[source]
        policy = self.dedup.get(source, DedupPolicy())  # type: ignore[call-overload]  # source: one of its keys
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
                raise ValueError(
                    f"schedule {schedule.name}: stages {', '.join(unknown)} are not stages of the project"
                )
        return self

    @model_validator(mode="after")
    def _signing_refs_are_this_projects(self) -> "Project":
        if self.signing is None:
            return self
        own = f"/_signing/{self.region_affinity}/{self.id}/"
        for index, identity in enumerate(self.signing.identities):
            for name in ("p12_ref", "passphrase_ref"):
                ref = getattr(identity, name)
                if own not in ref:
                    raise ValueError(
                        f"signing.identities[{index}].{name} {ref!r} is not under relevo/<stack>{own}: the agents of "
                        f"region {self.region_affinity} may read only their own region's project identities"
                    )
        return self

    @model_validator(mode="after")
    def _checkout_credentials_are_this_projects(self) -> "Project":
        ref = self.checkout.credentials_ref if self.checkout else None
        if ref is not None and f"/_git/{self.id}/" not in ref:
            raise ValueError(
                f"checkout.credentials_ref {ref!r} is not under relevo/<stack>/_git/{self.id}/: a project's git "
                "credentials live under its own id"
            )
        return self

    @model_validator(mode="after")
    def _warning_codes_are_not_transient(self) -> "Project":
        transient = set(self.retry.transient_exit_codes)
        for index, stage in enumerate(self.stages):
            both = sorted(transient & set(stage.warning_exit_codes))
            if both:
                raise ValueError(
                    f"stages[{index}].warning_exit_codes: {', '.join(map(str, both))} also in retry.transient_exit_codes: "
                    "an exit code is either a warning (the job goes on) or transient (the stage is retried)"
                )
        return self

    @model_validator(mode="after")
    def _output_variables_apart(self) -> "Project":
        # RELEVO_OUT_<STAGE>_<KEY> (a shard's RELEVO_OUT_<STAGE>_SHARD<k>_<KEY>): two stages, or a
        # stage and a shard, that read the same there would mix their values.
        seen: dict[str, str] = {}
        for stage in self.stages:
            count = shard_count(stage.parallel, stage.matrix)
            names = [variable_part(stage.name)] + (
                [shard_variable_part(stage.name, k) for k in range(count)] if count > 1 else []
            )
            for name in names:
                other = seen.setdefault(name, stage.name)
                if other != stage.name:
                    raise ValueError(
                        f"stages {other} and {stage.name} would both hand on their values as RELEVO_OUT_{name}_…: rename one"
                    )
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
                    aws_profile=stage.aws_profile,
                    requires=stage.requires,
                    handoff=stage.handoff,
                    warning_exit_codes=stage.warning_exit_codes,
                    parallel=stage.parallel,
                    matrix=stage.matrix,
                    fail_fast=stage.fail_fast,
                    max_parallel=stage.max_parallel,
                )
                for stage in self.stages
            )
        )
