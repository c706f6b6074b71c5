"""The run plan: what a project declares and what a job freezes at enqueue."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

import itertools
import re
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from relevo_core.models.cache import MAX_CACHES, CacheSpec
from relevo_core.models.capabilities import MAX_REQUIREMENTS, Requirements
from relevo_core.models.effect import Effect
from relevo_core.models.errors import EX_TEMPFAIL, ErrorClass
from relevo_core.models.handoff import MAX_PATTERNS, normal_pattern, path_problem
from relevo_core.models.stage_tests import StageTests, check_test_plan

STAGE_NAME = r"^[a-z][a-z0-9_-]{0,62}$"
# What the AWS CLI accepts as a profile name in practice (no spaces, brackets or '=').
AWS_PROFILE = r"^[A-Za-z0-9_.@+-]{1,64}$"
DEFAULT_ATTEMPTS = 3
MAX_ATTEMPTS = 5

Attempts = Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)]
# The longest a job may stay queued: waiting for a claim of a stage, and waiting for its project's
# lock (job.asl.json gives up with Relevo.Timeout.Queue). 24 hours, whose wait for a project costs
# 288 parks of history at most (execution.lock_wait): under half of Step Functions' 25,000-event
# execution history quota (tests/integration/test_waiting_history.py).
MAX_QUEUE_TIMEOUT_SEC = 24 * 3600
# The longest an approval gate waits for its answer (ApprovalSettings.timeout_sec); a job queued
# behind it waits that long without spending its queue timeout (execution.gate_wait).
MAX_APPROVAL_TIMEOUT_SEC = 7 * 24 * 3600


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OutputRule(_Frozen):
    """A regular expression over a stage's output that names the error class of a failure."""

    pattern: str = Field(
        min_length=1,
        max_length=512,
        description="A Python regular expression, searched in the failed attempt's output.",
    )
    error_class: ErrorClass = Field(description="The error class a match gives the failure (so its retries).")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:  # not a ValueError: pydantic would let it escape as a 500
            raise ValueError(f"not a regular expression: {exc}") from exc
        return value


class RetryPolicy(_Frozen):
    """How a failed attempt is classified and how often each class is tried."""

    transient_exit_codes: tuple[Annotated[int, Field(ge=1, le=255)], ...] = Field(
        default=(EX_TEMPFAIL,),
        description="Exit codes that are transient (Relevo.Transient.ExitCode, retried). Any other non-zero "
        "exit "
        "fails the job at once (Relevo.Fatal.ExitCode). Default: 75 (EX_TEMPFAIL).",
    )
    output_rules: tuple[OutputRule, ...] = Field(
        default=(),
        description="Patterns over a failed attempt's output that name its error class; the first match "
        "wins.",
    )
    attempts: dict[ErrorClass, Attempts] = Field(
        default_factory=dict,
        description="Attempts (1 to 5) per retryable error class, e.g. Relevo.Lease.Expired: 5; a class not "
        "named "
        "gets default_attempts. Non-retryable classes always get one.",
    )
    default_attempts: Attempts = Field(
        default=DEFAULT_ATTEMPTS, description="Attempts (1 to 5) of a retryable class not named in attempts."
    )
    # Exponential backoff with full jitter: attempt n waits a random time below
    # min(max_delay_sec, backoff_base_sec * 2^(n-1)).
    backoff_base_sec: int = Field(
        default=2,
        ge=0,
        le=600,
        description="After attempt n the next waits a random time below min(max_delay_sec, backoff_base_sec "
        "× 2^(n-1)) "
        "(exponential backoff, full jitter); 0: no wait.",
    )
    max_delay_sec: int = Field(
        default=60, ge=0, le=3600, description="The longest wait between two attempts."
    )

    def backoff_caps_sec(self) -> list[int]:
        """Index n: the cap of the wait after attempt n (index 0 unused), up to MAX_ATTEMPTS."""
        return [0] + [
            min(self.max_delay_sec, self.backoff_base_sec * 2 ** (n - 1)) for n in range(1, MAX_ATTEMPTS + 1)
        ]

    def attempts_for(self, error_class: ErrorClass) -> int:
        if not error_class.retryable:
            return 1
        return self.attempts.get(error_class, self.default_attempts)


# Where a project's signing identities live in Secrets Manager: relevo/<stack>/_signing/<region
# affinity>/<project>/…, so that each region's agent role may read its own region's and nothing
# wider (template.yaml, AgentPolicy: ReadSigningIdentities). No project id starts with _.
SIGNING_SECRET = (
    r"^relevo/[A-Za-z0-9-]+/_signing/[a-z][a-z0-9-]{0,31}/[a-z0-9][a-z0-9-]{0,62}/[A-Za-z0-9/_+=.@-]+$"
)


class SigningIdentity(_Frozen):
    """One code-signing identity (a certificate with its private key) the agent imports."""

    p12_ref: str = Field(
        max_length=512,
        pattern=SIGNING_SECRET,
        description="Secrets Manager name of the identity's PKCS#12 (.p12) file, stored as SecretBinary "
        "(`aws secretsmanager create-secret --secret-binary fileb://identity.p12`; a SecretString is "
        "refused), under "
        "relevo/<stack>/_signing/<region_affinity>/<project>/.",
    )
    passphrase_ref: str = Field(
        max_length=512,
        pattern=SIGNING_SECRET,
        description="Secrets Manager name of the .p12's passphrase (SecretString, the passphrase itself, "
        "one line), "
        "under the same prefix.",
    )


class SigningPlan(_Frozen):
    """A temporary signing keychain for each stage of the job (macOS agents only)."""

    keychain: Literal["temporary"] = Field(
        description="temporary: before each stage of the job the agent creates a keychain of its own under "
        "<workspace_root>/.relevo-keychains with a random password, imports the identities (codesign may "
        "use their "
        "keys without a GUI prompt: key partition list apple-tool:,apple:,codesign:), unlocks it, puts it "
        "first on "
        "the user's keychain search list and gives the stage its path as RELEVO_KEYCHAIN; after the stage, "
        "on every "
        "ending, it takes it off the search list and deletes it. While such a stage runs, the agent runs no "
        "other "
        "stage (the search list is the user's, not the process's). An agent that is not on macOS, or that "
        "runs stages "
        "as a build user (run_as), fails the stage with Relevo.Fatal.KeychainUnsupported; a keychain that "
        "cannot be "
        "made fails it with Relevo.Fatal.Keychain."
    )
    identities: tuple[SigningIdentity, ...] = Field(
        min_length=1,
        max_length=8,
        description="The identities to import (1 to 8), each a .p12 and its passphrase in Secrets Manager.",
    )


def _safe_pattern(pattern: str) -> str:
    problem = path_problem(pattern, pattern=True)
    if problem:
        raise ValueError(f"{pattern!r} {problem}")
    return pattern


def check_handoff_patterns(patterns: tuple[str, ...]) -> tuple[str, ...]:
    require_unique([normal_pattern(pattern) for pattern in patterns], "handoff path")
    return patterns


# Checked one by one, so a mistake names its own line of the project file.
HandoffPattern = Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(_safe_pattern)]


# A stage's fan-out (issue 32): `parallel: N` runs N shards of it, `matrix` one shard per
# combination of its values. How many shards a job may run in all is the history arithmetic's
# (relevo_core.plan_limits.require_shards_fit); these bounds only keep a declaration sane.
MATRIX_KEY = r"^[a-z][a-z0-9_]{0,31}$"
MAX_MATRIX_KEYS = 4
MAX_MATRIX_VALUES = 64
MAX_DECLARED_SHARDS = 256
MatrixValue = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f]+$")]
Matrix = dict[
    Annotated[str, Field(pattern=MATRIX_KEY)],
    Annotated[tuple[MatrixValue, ...], Field(max_length=MAX_MATRIX_VALUES)],
]


class Shard(_Frozen):
    """One shard of a stage: its 0-based index, the stage's shard count and, for a matrix, its
    combination (key → value)."""

    index: int = Field(ge=0)
    count: int = Field(ge=1)
    matrix: dict[str, str] = Field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        """RELEVO_SHARD_INDEX, RELEVO_SHARD_COUNT and one RELEVO_MATRIX_<KEY> per matrix key."""
        env = {"RELEVO_SHARD_INDEX": str(self.index), "RELEVO_SHARD_COUNT": str(self.count)}
        env |= {f"RELEVO_MATRIX_{key.upper()}": value for key, value in self.matrix.items()}
        return env

    @property
    def label(self) -> str:
        """How logs and views name the shard: a matrix's combination (`device=iPhone 16, os=18.2`),
        else its index as RELEVO_SHARD_INDEX has it (what `relevo job logs --shard` takes too)."""
        return ", ".join(f"{key}={value}" for key, value in self.matrix.items()) or str(self.index)


def check_fan_out(
    parallel: int | None,
    matrix: dict[str, Any] | None,
    fail_fast: bool | None,
    max_parallel: int | None,
) -> None:
    """One way to fan a stage out: `parallel` or `matrix`, not both; `fail_fast` and
    `max_parallel` only with one of them; a matrix with values under every key. (Each shard hands
    on its own paths: two that hand on one path differently fail the stage that restores them.)"""
    if parallel is not None and matrix is not None:
        raise ValueError(
            "parallel and matrix are exclusive: a matrix already runs one shard per combination; keep one "
            "of them"
        )
    if parallel is None and matrix is None:
        extra = [
            name
            for name, value in (("fail_fast", fail_fast), ("max_parallel", max_parallel))
            if value is not None
        ]
        if extra:
            raise ValueError(
                f"{' and '.join(extra)} apply to a stage with parallel or matrix, and this stage has neither"
            )
    if matrix is not None:
        if not matrix:
            raise ValueError("matrix: name at least one key with its values")
        for key, values in matrix.items():
            if not values:
                raise ValueError(f"matrix.{key}: no values; give at least one")
            require_unique(list(values), f"matrix.{key} value")


def check_effect_stage(
    command_field: str,
    command: str | None,
    effect: Any,
    effect_probe: str | None,
    effect_resume: str | None,
    sharded: bool,
    handoff: tuple[str, ...] = (),
) -> None:
    """A stage runs a command or performs a built-in effect (docs/release-effects.md), never both:
    the agent probes and resumes a built-in effect itself, so a stage with one declares no command,
    no effect_probe and no effect_resume; and it is not fanned out (an effect happens once)."""
    if effect is None:
        if command is None:
            raise ValueError(
                f"{command_field}: a stage needs a command ({command_field}) or a built-in effect (effect)"
            )
        return
    for name, value in (
        (command_field, command),
        ("effect_probe", effect_probe),
        ("effect_resume", effect_resume),
    ):
        if value is not None:
            raise ValueError(
                f"{name}: a stage with an effect ({effect.kind}) has no {name}: the agent performs, probes "
                f"and resumes the effect itself; remove {name}, or move the command to a stage of its own"
            )
    if sharded:
        raise ValueError(
            f"effect: a stage with an effect ({effect.kind}) is not fanned out (parallel, matrix): the "
            "effect happens once"
        )
    if handoff:
        raise ValueError(
            f"handoff: a stage with an effect ({effect.kind}) makes no files to hand on; hand them on from "
            "the stage that builds them"
        )


def shard_count(parallel: int | None, matrix: dict[str, Any] | None) -> int:
    """How many shards a stage runs: 1 without a fan-out."""
    if matrix:
        count = 1
        for values in matrix.values():
            count *= len(values)
        return count
    return parallel or 1


class StagePlan(_Frozen):
    """One stage exactly as it will run: frozen into the envelope when the job is enqueued."""

    name: str = Field(pattern=STAGE_NAME)
    # The stage's command; None for a stage whose `effect` the agent performs itself.
    command: str | None = Field(default=None, min_length=1, max_length=16_384)
    exec_timeout_sec: int = Field(default=3600, ge=1, le=86_400)
    # After the exec timeout the agent sends SIGTERM, then SIGKILL after this grace.
    kill_grace_sec: int = Field(default=10, ge=0, le=300)
    retry: RetryPolicy = RetryPolicy()
    # A read-only command that tells whether the stage's effect already exists.
    effect_probe: str | None = Field(default=None, max_length=16_384)
    # Run instead of `command` when the probe says the effect is in progress (relevo_agent.reconcile).
    effect_resume: str | None = Field(default=None, max_length=16_384)
    # A built-in release effect the agent performs, probes and resumes itself instead of a command
    # (relevo_agent.effects; relevo_core.models.effect).
    effect: Effect | None = None
    # Workspace-relative globs whose contents, with the commit, make the stage's precondition:
    # when they change between attempts, reconciliation stops with Relevo.Precondition.Changed.
    inputs: tuple[Annotated[str, Field(min_length=1, max_length=512)], ...] = Field(default=(), max_length=64)
    # The AWS profile (of the build user's own configuration on the Mac) the command runs with;
    # a stage never sees the agent's credentials (relevo_agent.stage_env).
    aws_profile: str | None = Field(default=None, pattern=AWS_PROFILE)
    # What an agent must have to claim the stage (relevo_core.models.capabilities).
    requires: Requirements = Field(default_factory=dict, max_length=MAX_REQUIREMENTS)
    # Workspace-relative paths or globs the stage hands on to every later stage of the job
    # (relevo_core.models.handoff, docs/handoff.md).
    handoff: tuple[HandoffPattern, ...] = Field(default=(), max_length=MAX_PATTERNS)
    # Non-zero exit codes that mean "succeeded, with warnings": the stage ends `warning`.
    warning_exit_codes: tuple[Annotated[int, Field(ge=1, le=255)], ...] = Field(default=(), max_length=32)
    # The test reports the command leaves, read after it (relevo_core.models.stage_tests).
    tests: StageTests | None = None
    # The fan-out (None, None: one run of the stage); fail_fast and max_parallel only with one.
    parallel: int | None = Field(default=None, ge=2, le=MAX_DECLARED_SHARDS)
    matrix: Matrix | None = Field(default=None, max_length=MAX_MATRIX_KEYS)
    fail_fast: bool | None = None
    max_parallel: int | None = Field(default=None, ge=1, le=MAX_DECLARED_SHARDS)
    # The project's caches the stage restores and saves, copied (relevo_core.models.cache).
    caches: tuple[CacheSpec, ...] = Field(default=(), max_length=MAX_CACHES)

    @field_validator("handoff")
    @classmethod
    def _handoff(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        return check_handoff_patterns(patterns)

    @model_validator(mode="after")
    def _fan_out(self) -> "StagePlan":
        check_fan_out(self.parallel, self.matrix, self.fail_fast, self.max_parallel)
        check_test_plan(self.tests, self.parallel)
        check_effect_stage(
            "command",
            self.command,
            self.effect,
            self.effect_probe,
            self.effect_resume,
            self.sharded,
            self.handoff,
        )
        return self

    @property
    def sharded(self) -> bool:
        return self.parallel is not None or self.matrix is not None

    @property
    def shard_count(self) -> int:
        return shard_count(self.parallel, self.matrix)

    @property
    def stops_siblings(self) -> bool:
        """fail_fast, true unless the project said false: the first shard failing for good stops the
        others."""
        return self.fail_fast is not False

    def shards(self) -> list[Shard]:
        """The stage's shards in order: 0 to parallel - 1, or the matrix's combinations, the
        first key varying slowest (the order the project file lists them)."""
        count = self.shard_count
        if not self.matrix:
            return [Shard(index=index, count=count) for index in range(count)]
        keys = list(self.matrix)
        return [
            Shard(index=index, count=count, matrix=dict(zip(keys, combination, strict=True)))
            for index, combination in enumerate(itertools.product(*(self.matrix[key] for key in keys)))
        ]


class ApprovalSettings(_Frozen):
    """An approval gate before one stage: the job waits until a person answers."""

    enabled: bool = Field(
        default=False,
        description="Ask before the gated stage: the job becomes waiting, and nothing of that stage runs "
        "until "
        "`relevo job approve JOB`; `relevo job reject JOB --reason …` fails it (Relevo.Approval.Rejected).",
    )
    before: str | None = Field(
        default=None,
        pattern=STAGE_NAME,
        description="The gated stage. Default: the first stage whose name starts with deploy.",
    )
    # Both spellings stay readable (stored projects and frozen envelopes carry them); the reference
    # documents timeout_sec, like every other timeout of a project.
    timeout_minutes: int = Field(
        default=0,
        ge=0,
        le=MAX_APPROVAL_TIMEOUT_SEC // 60,
        description="The same wait in whole minutes (0: 24 hours), kept for older project files; "
        "timeout_sec wins when both are set.",
    )
    timeout_sec: int | None = Field(
        default=None,
        ge=1,
        le=MAX_APPROVAL_TIMEOUT_SEC,
        description="How long the gate waits for an answer, in seconds (default 86400, 24 hours); then the "
        "job fails "
        "with Relevo.Approval.Timeout.",
    )

    @property
    def effective_timeout_sec(self) -> int:
        return self.timeout_sec or (self.timeout_minutes or 24 * 60) * 60

    def gated_stage(self, stage_names: list[str]) -> str | None:
        """The stage approval is asked before: `before`, or by default the first deploy stage."""
        if not self.enabled:
            return None
        if self.before is not None:
            return self.before
        return next((name for name in stage_names if name.startswith("deploy")), None)


def require_unique(names: list[str], what: str) -> None:
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"{what} names must be unique, repeated: {', '.join(duplicates)}")


def check_stage_names(stages: tuple[StagePlan, ...]) -> tuple[StagePlan, ...]:
    require_unique([stage.name for stage in stages], "stage")
    return stages


class RunPlanMixin(BaseModel):
    """Validation shared by a project's declaration and a job's frozen copy of it."""

    @model_validator(mode="after")
    def _stage_references(self) -> Self:
        stages = getattr(self, "stages", ())
        names = {stage.name for stage in stages}
        approval = getattr(self, "approval", None)
        if approval is not None and approval.before is not None and approval.before not in names:
            raise ValueError(f"approval.before names an unknown stage: {approval.before}")
        if (
            approval is not None
            and approval.enabled
            and approval.gated_stage([stage.name for stage in stages]) is None
        ):
            raise ValueError(
                "approval.before: approval is enabled but no stage is named and none is a deploy stage"
            )
        from_stage = getattr(self, "from_stage", None)
        if from_stage is not None and from_stage not in names:
            raise ValueError(f"from_stage names an unknown stage: {from_stage}")
        return self
