"""GET /jobs/{id}: a job as operators see it (relevo_core.jobs.view builds it), as the API answers it
and its OpenAPI document describes it. Fields a later version adds pass through (extra="allow")."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from relevo_core.models.cache import CacheOutcome
from relevo_core.models.effect_summary import EffectSummary
from relevo_core.models.test_results import ResultsSummary
from relevo_core.models.transfer import TransferProgress


class ShardView(BaseModel):
    """One shard of a stage with shards (`parallel` or `matrix`) and what its last attempt did."""

    model_config = ConfigDict(extra="allow")

    shard: int = Field(description="the shard's index, 0-based (RELEVO_SHARD_INDEX)")
    label: str = Field(
        description="how views and logs name it: its matrix combination (`device=iPhone 16, os=18.2`), else "
        "its index"
    )
    matrix: dict[str, str] = Field({}, description="a matrix shard's values, by key (RELEVO_MATRIX_<KEY>)")
    status: str = Field(
        description="a stage-attempt status; pending until the shard is dispatched, canceled when a sibling "
        "failed (fail_fast)"
    )
    attempt: int | None = None
    dispatched_attempt: int | None = None
    agent_id: str | None = Field(None, description="the Mac (agent) that claimed its attempt")
    exit_code: int | None = None
    error_class: str | None = None
    retry_count: int = 0
    attempts_log: list[dict[str, Any]] = Field(
        [], description="every failed attempt of the shard: attempt, agent, error, cause, at"
    )
    dispatched_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    last_writer: str | None = None
    reconciled: dict[str, Any] | None = Field(
        None,
        description="the shard's latest reconciliation: attempt, agent_id, decision, evidence (probe_exit, "
        "previous_attempt, why), at",
    )
    outputs: dict[str, str] = Field(
        {},
        description="the values the shard wrote to $RELEVO_OUTPUT (later stages get "
        "RELEVO_OUT_<STAGE>_SHARD<k>_<KEY>)",
    )
    handoff: dict[str, Any] | None = Field(
        None,
        description="what the shard handed on and what its Mac restored before its command, as a stage's "
        "`handoff`",
    )
    caches: list[CacheOutcome] = Field(
        [],
        description="the attempt's caches (docs/caches.md): each one's restore (hit, partial: a restore "
        "key's entry, miss) with its key, the key restored, bytes, bytes downloaded and seconds, and its "
        "save (saved, exists, not_saved, skipped, failed) with bytes uploaded",
    )
    tests: ResultsSummary | None = Field(
        None,
        description="the shard: its tests as its last attempt's reports said them (counts, flaky, "
        "quarantined, warnings, the results document's key); none without reports declared "
        "(docs/test-results.md)",
    )


class StageView(BaseModel):
    """One stage of the plan and what its last attempt did."""

    model_config = ConfigDict(extra="allow")

    index: int
    name: str
    requires: dict[str, str] = {}
    status: str = Field(
        description="a stage-attempt status (pending, dispatched, running, succeeded, warning, failed, …)"
    )
    reused_from: str | None = Field(
        None, description="the earlier job whose result a stage before from_stage keeps"
    )
    retry_count: int = 0
    cumulative_backoff_sec: float = 0
    attempts_log: list[dict[str, Any]] = Field(
        [], description="every failed attempt: attempt, agent, error, cause, at"
    )
    attempt: int | None = None
    dispatched_attempt: int | None = None
    agent_id: str | None = None
    exit_code: int | None = None
    error_class: str | None = None
    dispatched_at: str | None = None
    enqueued_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    last_writer: str | None = None
    outcome: str | None = None
    reconciled: dict[str, Any] | None = None
    reconciliations: list[dict[str, Any]] = []
    resolution: dict[str, Any] | None = None
    transfers: list[TransferProgress] = Field(
        [], description="each attempt's artifact upload, oldest attempt first"
    )
    transfer: TransferProgress | None = Field(
        None, description="the upload of the attempt shown (live while it uploads)"
    )
    outputs: dict[str, str] = Field(
        {},
        description="the values the stage wrote to $RELEVO_OUTPUT (later stages get "
        "RELEVO_OUT_<STAGE>_<KEY>)",
    )
    handoff: dict[str, Any] | None = Field(
        None,
        description="what the stage handed on (files, bytes, digest, uploaded_bytes, manifest) and what its "
        "Mac restored before "
        "its command (restored_bytes: downloaded; 0 when the files were already there); docs/handoff.md",
    )
    caches: list[CacheOutcome] = Field(
        [],
        description="the attempt's caches (docs/caches.md): each one's restore (hit, partial: a restore "
        "key's entry, miss) with its key, the key restored, bytes, bytes downloaded and seconds, and its "
        "save (saved, exists, not_saved, skipped, failed) with bytes uploaded",
    )
    tests: ResultsSummary | None = Field(
        None,
        description="a stage without shards: its tests as its last attempt's reports said them "
        "(counts, flaky, quarantined, warnings, the results document's key); none without reports declared "
        "(docs/test-results.md)",
    )
    effect: EffectSummary | None = Field(
        None,
        description="a stage with a built-in release effect (docs/release-effects.md): its kind, the "
        "identifiers it recorded, Apple's state, in a line; none for a stage without one",
    )
    warning: str | None = Field(
        None,
        description="a `warning` stage: what made it one (a warning exit code, lines marked ::warning::), "
        "in a sentence",
    )
    shards: list[ShardView] = Field(
        [],
        description="a stage with shards: each shard's own attempt, in shard order (empty for a stage "
        "without shards)",
    )
    test_plan: dict[str, Any] | None = Field(
        None,
        description="a stage with tests.plan, once its first shard made the plan (docs/test-results.md): "
        "`by` (time, or count without history), `history_jobs`, `allow_empty`, `listing_sha256`, and "
        "`shards`: each shard's `tests` and `expected_sec`",
    )
    failed_shards: list[int] = Field(
        [],
        description="a stage with shards: the shards that failed, in shard order (its error_class: the "
        "class the stage failed with)",
    )


class WaitingBehind(BaseModel):
    """The job of the project a queued job waits behind, while that one waits at its approval gate."""

    job_id: str
    stage: str = Field(description="the stage it waits for approval before")
    since: str = Field(description="when it began to wait there (ISO 8601)")


class JobView(BaseModel):
    """A job, its stages in plan order, its artifacts and the tail of its log."""

    model_config = ConfigDict(extra="allow")

    job_id: str
    project: str
    status: str
    trigger: dict[str, Any]
    ref: str
    commit: str | None = None
    commit_source: str | None = Field(
        None,
        description="trigger: the trigger named the commit; checkout: the job's first checkout resolved its "
        "ref",
    )
    region_affinity: str
    priority: int
    queue_seq: int | None = None
    created_at: str | None = None
    updated_at: str | None = None
    ended_at: str | None = None
    current_stage: str | None = None
    queue_reason: str | None = Field(
        None,
        description="why a queued job, or a dispatched stage, waits: project_running (another job of its "
        "project runs), "
        "project_waiting_for_approval (the job of its project ahead of it waits at its approval gate: "
        "waiting_behind), "
        "agent_offline, agent_busy, agent_paused, no_matching_agent, agent_low_disk",
    )
    queue_detail: str | None = Field(
        None, description="the queue reason in a sentence, where it has more to say than its code"
    )
    waiting_behind: WaitingBehind | None = Field(
        None,
        description="project_waiting_for_approval: the job that holds the project and waits for approval",
    )
    waiting_shards: list[dict[str, Any]] = Field(
        [],
        description="the shards dispatched and not claimed yet, each with why it waits: {stage, shard, "
        "attempt, queue_reason, queue_detail}",
    )
    held_reason: str | None = None
    waiting_stage: str | None = None
    approval_decision: dict[str, Any] | None = None
    from_stage: str | None = None
    retry_of: str | None = None
    build_number: int | None = Field(
        None,
        description="the job's build number (RELEVO_BUILD_NUMBER): given by the first claim of a stage "
        "that needs one, the same on every retry, rerun and redrive of the job; none before",
    )
    last_successful_stage: str | None = None
    last_writer: str | None = None
    error: str | None = None
    error_cause: str | None = None
    warning_stages: list[str] = Field(
        [], description="the stages that ended `warning` (succeeded, with something to look at)"
    )
    stages: list[StageView]
    artifact_max_job_bytes: int | None = None
    artifacts: list[dict[str, Any]] = []
    artifact_bytes: int = 0
    handoff_bytes: int = Field(0, description="of artifact_bytes, what the stages' handoffs store")
    log_tail: dict[str, Any] | None = None
