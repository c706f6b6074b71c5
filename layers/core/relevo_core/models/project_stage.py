"""A project's stage as its project file declares it: the command, where it may run, what it hands
on, and how it fans out into shards (frozen into a job as a StagePlan, Project.frozen_stages)."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from relevo_core.models.cache import CACHE_NAME, MAX_CACHES
from relevo_core.models.capabilities import MAX_REQUIREMENTS, Requirements
from relevo_core.models.effect import Effect
from relevo_core.models.handoff import MAX_PATTERNS
from relevo_core.models.plan import (
    AWS_PROFILE,
    MAX_DECLARED_SHARDS,
    MAX_MATRIX_KEYS,
    HandoffPattern,
    Matrix,
    check_effect_stage,
    check_fan_out,
    check_handoff_patterns,
)
from relevo_core.models.stage_tests import StageTests, check_test_plan


class ProjectStage(BaseModel):
    """One stage: a command run on one agent of the project's region."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        pattern=r"^[a-z][a-z0-9_-]{0,62}$",
        description="Unique in the project: a lowercase letter, then lowercase letters, digits, _ and -.",
    )
    run: str | None = Field(
        default=None,
        min_length=1,
        description="The command (at most 16 KiB, refused as PLAN_TOO_LARGE): `bash -c` in the project's "
        "workspace on the agent, in its own process group, with "
        "RELEVO_JOB_ID, RELEVO_STAGE, RELEVO_REF, RELEVO_COMMIT, RELEVO_ATTEMPT, RELEVO_OPERATION_ID, "
        "RELEVO_WORKSPACE "
        "and RELEVO_ARTIFACT_DIR set (and RELEVO_KEYCHAIN, the path of the stage's signing keychain, when "
        "the project sets signing). "
        "Files left in $RELEVO_ARTIFACT_DIR are uploaded as the stage's artifacts. "
        "Required unless the stage declares an effect.",
    )
    exec_timeout_sec: int = Field(
        default=3600,
        ge=1,
        le=86_400,
        description="How long the command may run; then the agent stops it and the attempt fails with "
        "Relevo.Timeout.Exec.",
    )
    kill_grace_sec: int = Field(
        default=10,
        ge=0,
        le=300,
        description="Seconds between SIGTERM and SIGKILL to the stage's process group when it is stopped.",
    )
    effect_probe: str | None = Field(
        default=None,
        description="A read-only command (at most 16 KiB) telling whether the stage's effect already "
        "exists, run before an attempt whose previous outcome is unknown is run again, with the previous "
        "attempt's values as RELEVO_PREVIOUS_OUT_<KEY>: exit 0 with $RELEVO_OPERATION_ID in its output "
        "means it is done (the stage is reconciled as succeeded), exit 1 that it is absent (run again "
        "under the same operation id), exit 118 with $RELEVO_OPERATION_ID in its output that it was "
        "started and is still in progress (effect_resume runs, never run); any other exit, a timeout or "
        "a signal: it cannot tell (manual review, nothing run). What it prints is kept as the evidence. "
        "See docs/agent.md.",
    )
    effect_resume: str | None = Field(
        default=None,
        min_length=1,
        description="The command (at most 16 KiB) run instead of `run` when the effect_probe says the "
        "effect is in progress (exit 118): it waits for what the previous attempt started (a "
        "notarization's submission id, given as RELEVO_PREVIOUS_OUT_<KEY>, RELEVO_RESUME=1) and never "
        "starts it again. Its exit decides the stage as run's would; its values, artifacts and handoff "
        "are recorded alike (the previous attempt's values carried on). Needs an effect_probe; without "
        "one, an effect in progress waits for a person.",
    )
    effect: Effect | None = Field(
        default=None,
        description="A built-in release effect the agent performs itself instead of a command, exactly "
        "once: `{kind: app_store_upload | notarization | github_release_asset | s3_object, file: …}` "
        "(docs/release-effects.md). Its identifiers are recorded before it can have happened, a retry "
        "probes for it and resumes it rather than start it again, and what it leaves becomes the "
        "stage's values. A stage with an effect has no run, effect_probe or effect_resume, no "
        "parallel or matrix, and no handoff; its file is one an earlier stage hands on (handoff), or, with a "
        "checkout, a file of the repository.",
    )
    inputs: tuple[Annotated[str, Field(min_length=1, max_length=512)], ...] = Field(
        default=(),
        max_length=64,
        description="Workspace-relative globs whose contents, with the commit, are the stage's "
        "precondition: when "
        "they change between attempts, reconciliation stops with Relevo.Precondition.Changed.",
    )
    aws_profile: str | None = Field(
        default=None,
        pattern=AWS_PROFILE,
        description="The build user's AWS profile this stage runs with (AWS_PROFILE in its environment); "
        "the stage "
        "never sees the agent's own credentials.",
    )
    requires: Requirements = Field(
        default_factory=dict,
        max_length=MAX_REQUIREMENTS,
        description='What the agent must have to claim this stage, as `key: glob`, e.g. `{xcode: "16.*", '
        "arch: arm64}`: "
        "`xcode` is the selected Xcode's version, `macos` the macOS version, `arch` the CPU architecture, "
        "`os` darwin or "
        "linux; any other key is a label of the agent's TOML. Frozen into each job's plan. No agent of the "
        "region "
        "matching: the job waits with queue reason no_matching_agent.",
    )
    handoff: tuple[HandoffPattern, ...] = Field(
        default=(),
        max_length=MAX_PATTERNS,
        description="Workspace-relative paths or globs (`build/App.app`, `build/*.ipa`, `**/*.dSYM`) the "
        "stage hands on: "
        "when its command succeeds the agent stores them (files, directories, symlinks, modes and mtimes, "
        "each file's "
        "sha256) under the job's artifact_uri, and restores them at the same paths before every later stage "
        "of the job, "
        "on whichever Mac, verifying every byte (Relevo.Fatal.Checksum). A path that matches nothing when "
        "the command "
        "ends fails the stage (Relevo.Fatal.HandoffMissing). No absolute path, no '..', nothing under .git. "
        "On a stage with "
        "shards, each shard hands on its own: a later stage restores every shard's, and two shards handing "
        "on one path "
        "differently fail it (Relevo.Fatal.HandoffConflict, naming both). See docs/handoff.md.",
    )
    warning_exit_codes: tuple[Annotated[int, Field(ge=1, le=255)], ...] = Field(
        default=(),
        max_length=32,
        description='Non-zero exit codes that mean "succeeded, with warnings" (e.g. a linter\'s 3): the '
        "stage ends "
        "`warning` and the job goes on as after a success, its artifacts and handoff stored. A line the "
        "command prints "
        "starting `::warning::` (GitHub Actions' spelling) makes a stage that exits 0 end `warning` too. "
        "`relevo job "
        "view`, `relevo job logs`, the console and the commit status say so. None may be a "
        "retry.transient_exit_codes code.",
    )
    tests: StageTests | None = Field(
        default=None,
        description="The test reports the command leaves (`junit`, `xcresult` globs), read by the agent "
        "after the command whether it passed or failed: stored with the attempt, counted on the stage "
        "(flaky tests told apart), and the tests the project quarantines (`quarantine`). A malformed "
        "report makes the stage `warning`, naming the file and line. On a stage with parallel, `plan` "
        "splits a test list across its shards by the time each test took in earlier jobs and checks that "
        "every planned test ran exactly once. See docs/test-results.md.",
    )
    parallel: int | None = Field(
        default=None,
        ge=2,
        le=MAX_DECLARED_SHARDS,
        description="Run the stage as this many shards at once, each an attempt of its own on an agent of "
        "the region (its own "
        "claim, lease, retries and reconcile), with RELEVO_SHARD_INDEX (0-based) and RELEVO_SHARD_COUNT "
        "set. How many shards "
        "a job may run in all is checked at `relevo project apply` (PLAN_TOO_LARGE). Exclusive with matrix. "
        "Each shard's "
        "values reach later stages as RELEVO_OUT_<STAGE>_SHARD<k>_<KEY>.",
    )
    matrix: Matrix | None = Field(
        default=None,
        max_length=MAX_MATRIX_KEYS,
        description='Run one shard per combination of these values, e.g. `{device: ["iPhone 16", "iPad '
        'Air"], os: ["18.2"]}`, '
        "each with RELEVO_MATRIX_<KEY> (the key upper-cased) and RELEVO_SHARD_INDEX / RELEVO_SHARD_COUNT "
        "set. Keys: lowercase "
        "letters, digits and _ (at most 4); values: 1 to 64 characters (at most 64 per key). Exclusive with "
        "parallel.",
    )
    fail_fast: bool | None = Field(
        default=None,
        description="With parallel or matrix (default true): the first shard that fails for good stops its "
        "running siblings "
        "(their process groups are killed and they end canceled) and fails the stage. false: the others run "
        "to their end, "
        "then the stage fails if any shard did.",
    )
    max_parallel: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DECLARED_SHARDS,
        description="With parallel or matrix: at most this many shards run at once (default: all of them); "
        "the others start "
        "as earlier ones end. At most 40 of a stage's shards run at once (a Step Functions inline Map's "
        "limit): a stage of "
        "more than 40 shards must set it to 40 or less, or be split; `relevo project apply` refuses it "
        "otherwise "
        "(PLAN_TOO_LARGE).",
    )

    cache: tuple[Annotated[str, Field(pattern=CACHE_NAME)], ...] = Field(
        default=(),
        max_length=MAX_CACHES,
        description="The project's caches (by name, from `caches:`) this stage restores before its command "
        "and saves after it (docs/caches.md).",
    )

    @field_validator("handoff")
    @classmethod
    def _handoff(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        return check_handoff_patterns(patterns)

    @model_validator(mode="after")
    def _fan_out(self) -> "ProjectStage":
        check_fan_out(self.parallel, self.matrix, self.fail_fast, self.max_parallel)
        check_test_plan(self.tests, self.parallel)
        sharded = self.parallel is not None or self.matrix is not None
        check_effect_stage(
            "run", self.run, self.effect, self.effect_probe, self.effect_resume, sharded, self.handoff
        )
        return self

    @field_validator("effect_resume")
    @classmethod
    def _resume_has_a_probe(cls, resume: str | None, info: ValidationInfo) -> str | None:
        # Only the probe's "in progress" (exit 118) runs it: alone it would never run, and a project
        # relying on it would see its `run` started again after a lost attempt.
        if resume is not None and not info.data.get("effect_probe"):
            raise ValueError(
                'effect_resume needs an effect_probe: only the probe\'s "in progress" (exit 118) runs it; '
                "declare the probe, or remove effect_resume"
            )
        return resume
