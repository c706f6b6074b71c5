"""A registered project: what runs, where, and how its webhooks are authenticated."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from relevo_core.models.build_number import BuildNumberSettings
from relevo_core.models.cache import MAX_CACHES, CacheLimits, CacheSpec, check_cache_names
from relevo_core.models.checkout_plan import CheckoutPlan
from relevo_core.models.handoff import pattern_covers, shard_variable_part, variable_part
from relevo_core.models.plan import (
    MAX_QUEUE_TIMEOUT_SEC,
    ApprovalSettings,
    RetryPolicy,
    RunPlanMixin,
    SigningPlan,
    StagePlan,
    check_stage_names,
    require_unique,
    shard_count,
)
from relevo_core.models.project_schedule import ProjectSchedule
from relevo_core.models.project_settings import (
    DEDUP_DEFAULTS,
    ArtifactLimits,
    CommitStatusSettings,
    DedupPolicy,
    ForkPolicy,
    OnRepeat,
    WebhookSecrets,
)
from relevo_core.models.project_stage import ProjectStage
from relevo_core.models.shapes import PROJECT_ID, REGION_AFFINITY


class Project(RunPlanMixin):
    """A registered project: its repository, its stages and where they run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(
        pattern=PROJECT_ID,
        description="The project's id: lowercase letters, digits and -, at most 63. It names the project in "
        "every "
        "command, in its webhook URL (/webhooks/github/<id>) and in its secrets' names.",
    )
    repo: str = Field(
        pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$",
        description="The Git repository as its webhooks name it (owner/name; GitLab: group/…/name). "
        "Deliveries from "
        "another repository are ignored.",
    )
    group: str | None = Field(
        default=None,
        pattern=PROJECT_ID,
        description="The project group it belongs to (lowercase letters, digits and -): the console's run "
        "page and "
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
        description="Which Macs run the stages: the agents of this region affinity, one of the stack's "
        "RegionAffinities "
        "(`relevo project apply` refuses one the stack has no work queue for). A name of the fleet's own "
        "(eu-west, "
        "office-berlin), not an AWS region: the stack's AWS region (eu-west-1) holds every region "
        "affinity's work queue.",
    )
    priority: int = Field(
        default=0,
        ge=-1_000_000,
        le=1_000_000,
        description="Priority of the project's webhook and schedule jobs; higher runs first (relevo project "
        "run defaults to 10, the API to 0).",
    )
    stages: tuple[ProjectStage, ...] = Field(
        min_length=1,
        description="The stages (1 to 32, more is refused as PLAN_TOO_LARGE), run one after another, each "
        "on one agent of the region.",
    )
    queue_timeout_sec: int = Field(
        default=900,
        ge=1,
        le=MAX_QUEUE_TIMEOUT_SEC,
        description="How long a stage waits on the region's queue for an agent to claim it, and a job for "
        "its "
        "project's lock while another job of the project runs (not while that job waits at its approval "
        "gate); then the "
        "attempt fails with Relevo.Timeout.Queue.",
    )
    lease_ttl_sec: int = Field(
        default=60,
        ge=3,
        le=3600,
        description="The lease an agent holds on a stage it runs, renewed every lease/3; when it lapses "
        "(the agent "
        "died or lost the network) the attempt fails with Relevo.Lease.Expired and is retried.",
    )
    artifact: ArtifactLimits = Field(
        default=ArtifactLimits(), description="Bounds on the artifacts of the project's jobs."
    )
    workspace_cleanup: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="A command the agent runs in the project's workspace after its stages, between stages "
        "and never "
        "during one (once the agent is idle), e.g. `rm -rf ~/Library/Developer/Xcode/DerivedData/*`; "
        "bounded by the "
        "agent's cleanup_timeout_sec. Frozen into each job.",
    )
    signing: SigningPlan | None = Field(
        default=None,
        description="Opt-in: a temporary signing keychain for each stage of the project's jobs, with the "
        "identities "
        "named here imported from Secrets Manager (macOS agents only; see signing.keychain). Each ref must "
        "be under "
        "relevo/<stack>/_signing/<region_affinity>/<id>/ of this project: the region's agents may read that "
        "and "
        "nothing wider. Frozen into each job. Default: none.",
    )
    checkout: CheckoutPlan | None = Field(
        default=None,
        description="Opt-in: before each stage's command the agent makes the workspace the job's commit (a "
        "per-Mac "
        "mirror, a bounded fetch, a forced checkout, git clean), so every stage, retry and rerun builds the "
        "same commit "
        "even if the branch moves. The commit is the trigger's; else the first checkout resolves the ref "
        "and records "
        "it on the job. Frozen into each job. Without it the workspace is whatever the agent's earlier "
        "stages left "
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
        description="Where the webhook secrets are stored (references only; `relevo project apply` fills "
        "them in).",
    )
    dedup: dict[Literal["webhook", "schedule", "manual", "api", "retry"], DedupPolicy] = Field(
        default_factory=dict,
        description="Per trigger source (webhook, schedule, manual, api, retry): how long the same work "
        "counts as "
        "one job, and what it does after that.",
    )
    schedules: tuple[ProjectSchedule, ...] = Field(
        default=(),
        max_length=32,
        description="Timers that run the project (EventBridge Scheduler entries, kept by `relevo project "
        "apply`).",
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
    build_number: BuildNumberSettings | None = Field(
        default=None,
        description="Give each job a build number (RELEVO_BUILD_NUMBER): per project, in order, once per "
        "job, the same on every retry, rerun and redrive of it, never given to two jobs, with no gap (a job "
        "that took one keeps it, even when it fails). See docs/jobs.md#build-numbers.",
    )
    fork_pull_requests: ForkPolicy = Field(
        default=ForkPolicy.HOLD,
        description="What a pull request from a fork does: hold (a held job, started by `relevo job release "
        "JOB`), "
        "ignore, or run (for trusted forks).",
    )
    caches: tuple[CacheSpec, ...] = Field(
        default=(),
        max_length=MAX_CACHES,
        description="Caches the project's stages keep across jobs (a stage's `cache:` names the ones it "
        "uses): paths, a key made of files' hashes, the Mac's facts and the workspace, restore keys, and "
        "when to save. Entries are per project and region, written once, read by every job of the "
        "project, written only by jobs of `cache_write_refs`. See docs/caches.md.",
    )
    cache_limits: CacheLimits = Field(
        default=CacheLimits(),
        description="How much the project's caches keep in each region (max_total_bytes, least recently "
        "used evicted first) and for how long an unused entry stays (retention_days).",
    )
    cache_write_refs: tuple[str, ...] = Field(
        default=(),
        max_length=16,
        description="Branch or tag names (globs) whose jobs save caches; default: the default_ref only. "
        "A pull request's job (refs/pull/…, from a fork or not) restores but never saves.",
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

    @field_validator("caches")
    @classmethod
    def _unique_cache_names(cls, caches: tuple[CacheSpec, ...]) -> tuple[CacheSpec, ...]:
        return check_cache_names(caches)

    @field_validator("cache_write_refs")
    @classmethod
    def _write_refs_are_branches(cls, refs: tuple[str, ...]) -> tuple[str, ...]:
        for ref in refs:
            if not ref or ref.startswith(("refs/pull/", "refs/merge-requests/")):
                raise ValueError(
                    f"cache_write_refs: {ref!r} is not a branch or tag name: a pull request's job never "
                    "saves caches"
                )
        return refs

    @model_validator(mode="after")
    def _stage_caches_exist(self) -> "Project":
        known = {cache.name for cache in self.caches}
        for stage in self.stages:
            unknown = [name for name in stage.cache if name not in known]
            if unknown:
                raise ValueError(
                    f"stage {stage.name}: cache {', '.join(unknown)} is not one of the project's caches "
                    f"({', '.join(sorted(known)) or 'none declared'})"
                )
        return self

    @model_validator(mode="after")
    def _build_number_stages_exist(self) -> "Project":
        known = {stage.name for stage in self.stages}
        named = self.build_number.stages if self.build_number else ()
        unknown = [name for name in named if name not in known]
        if unknown:
            raise ValueError(f"build_number.stages: {', '.join(unknown)} are not stages of the project")
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
                        f"signing.identities[{index}].{name} {ref!r} is not under relevo/<stack>{own}: the "
                        "agents of "
                        f"region {self.region_affinity} may read only their own region's project identities"
                    )
        return self

    @model_validator(mode="after")
    def _checkout_credentials_are_this_projects(self) -> "Project":
        ref = self.checkout.credentials_ref if self.checkout else None
        if ref is not None and f"/_git/{self.id}/" not in ref:
            raise ValueError(
                f"checkout.credentials_ref {ref!r} is not under relevo/<stack>/_git/{self.id}/: a project's "
                "git "
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
                    f"stages[{index}].warning_exit_codes: {', '.join(map(str, both))} also in "
                    "retry.transient_exit_codes: "
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
                        f"stages {other} and {stage.name} would both hand on their values as "
                        f"RELEVO_OUT_{name}_…: rename one"
                    )
        return self

    @model_validator(mode="after")
    def _effect_files_handed_on(self) -> "Project":
        # Without a checkout, the only files a stage can count on, on whichever Mac, are those the
        # earlier stages hand on; with one, the file may be the repository's (the agent fails the
        # stage with Relevo.Fatal.HandoffMissing when it is not there).
        if self.checkout is not None:
            return self
        for index, stage in enumerate(self.stages):
            if stage.effect is None:
                continue
            earlier = [pattern for before in self.stages[:index] for pattern in before.handoff]
            if not any(pattern_covers(pattern, stage.effect.file) for pattern in earlier):
                raise ValueError(
                    f"stages[{index}].effect.file {stage.effect.file!r} is handed on by no earlier stage: "
                    "name it (or a directory or glob covering it) in an earlier stage's handoff"
                )
        return self

    def cache(self, name: str) -> CacheSpec:
        return next(cache for cache in self.caches if cache.name == name)

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
                    effect_resume=stage.effect_resume,
                    effect=stage.effect,
                    inputs=stage.inputs,
                    aws_profile=stage.aws_profile,
                    requires=stage.requires,
                    handoff=stage.handoff,
                    warning_exit_codes=stage.warning_exit_codes,
                    tests=stage.tests,
                    parallel=stage.parallel,
                    matrix=stage.matrix,
                    fail_fast=stage.fail_fast,
                    max_parallel=stage.max_parallel,
                    caches=tuple(self.cache(name) for name in stage.cache),
                )
                for stage in self.stages
            )
        )
