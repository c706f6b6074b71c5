"""Before a stage's command (or its effect probe) runs: the workspace made the job's, and the
environment given what the earlier stages left.

    checkout   the job's commit, when the project has `checkout:` (relevo_agent.checkout)
    restore    every earlier stage's handoff at the same paths, verified (relevo_agent.handoff)
    values     each earlier stage's $RELEVO_OUTPUT values as RELEVO_OUT_<STAGE>_<KEY>

Each step counts against the stage's exec deadline and stops when the stage is stopped. A
failure is the stage's, with the step's error class (relevo_agent.stage concludes it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relevo_agent import reconcile
from relevo_agent.config import AgentConfig
from relevo_core.jobs.handoff_sources import EarlierStage, JobContext, earlier_stages
from relevo_core.models.errors import ErrorClass, RelevoError
from relevo_core.models.handoff import MAX_HANDED_ON_OUTPUT_BYTES, output_variable, outputs_size
from relevo_core.models.plan import StagePlan
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.handoff.cache import HandoffCache
    from relevo_core.models.envelope import JobEnvelope

log = logging.getLogger(__name__)


class PrepareFailure(Exception):
    def __init__(self, error_class: ErrorClass, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


class PrepareStopped(Exception):
    """The stage was stopped (fenced, canceled, shut down) while its workspace was prepared."""


@dataclass
class Prepared:
    """What the stage runs with once its workspace is the job's."""

    commit: str | None
    precondition: str
    # RELEVO_COMMIT and every RELEVO_OUT_<STAGE>_<KEY>.
    variables: dict[str, str]
    earlier: list[EarlierStage]
    # sha256 -> where this job stored those bytes (the stage's own handoff references them).
    known: dict[str, Any] = field(default_factory=dict)
    restored: dict[str, Any] | None = None
    # The stage's caches as restored (relevo_agent.caches.CacheRun), saved after its command.
    caches: list[Any] = field(default_factory=list)
    cache_context: Any = None


def handoff_cache(config: AgentConfig) -> HandoffCache:
    from relevo_agent.handoff.cache import HandoffCache

    return HandoffCache(
        config.workspace_root, int(config.handoff_cache_gb * 1024**3) if config.handoff_cache_gb else None
    )


def output_variables(earlier: list[EarlierStage]) -> dict[str, str]:
    """RELEVO_OUT_<STAGE>_<KEY> of every earlier stage's values, a shard's as
    RELEVO_OUT_<STAGE>_SHARD<k>_<KEY>; two that would be the same variable fail the stage (the
    project file refuses stage names that would; keys can still), and so do values over
    MAX_HANDED_ON_OUTPUT_BYTES together."""
    variables: dict[str, str] = {}
    origin: dict[str, str] = {}
    for stage in earlier:
        for key, value in stage.outputs.items():
            name = output_variable(stage.name, key, stage.shard)
            if name in origin and origin[name] != f"{stage.label}.{key}":
                raise PrepareFailure(
                    ErrorClass.OUTPUT_INVALID,
                    f"the values {origin[name]} and {stage.label}.{key} would both be {name}: rename one of "
                    "the keys",
                )
            origin[name] = f"{stage.label}.{key}"
            variables[name] = value
    size = sum(len(name.encode()) + len(value.encode()) + 2 for name, value in variables.items())
    if size > MAX_HANDED_ON_OUTPUT_BYTES:
        largest = sorted(earlier, key=lambda stage: -outputs_size(stage.outputs))[:3]
        raise PrepareFailure(
            ErrorClass.OUTPUT_INVALID,
            f"the earlier stages' values come to {size} bytes as variables, over the "
            f"{MAX_HANDED_ON_OUTPUT_BYTES} a stage is handed "
            "(half of macOS's kern.argmax); the largest: "
            f"{', '.join(f'{s.label} {outputs_size(s.outputs)} bytes' for s in largest)}: "
            "keep large data in a handoff file and pass its path",
        )
    return variables


def prepare(
    config: AgentConfig,
    context: JobContext,
    plan: StagePlan,
    ref: stage_attempts.StageRef,
    workspace: Path,
    deadline: float,
    cancel: threading.Event,
    emit: Callable[[str], None],
) -> Prepared:
    """The workspace of `plan` made the job's; raises PrepareFailure or PrepareStopped."""
    envelope = context.envelope
    index = ref.stage_index
    try:
        commit = context.commit()
    except RelevoError as differ:  # COMMITS_DIFFER: the shards of the first checkout did not agree
        raise PrepareFailure(ErrorClass.CHECKOUT_FAILED, f"checkout: {differ.message}") from None
    workspace.mkdir(parents=True, exist_ok=True)
    if envelope.checkout is not None:
        from relevo_agent.checkout import checkout
        from relevo_agent.git_commands import CheckoutFailure, CheckoutStopped

        def record(resolved: str) -> str:
            return stage_attempts.record_checkout_commit(ref, resolved)

        try:
            commit = checkout(
                envelope.checkout,
                config.workspace_root,
                workspace,
                envelope.ref,
                commit,
                record,
                deadline,
                cancel,
                emit,
                config.build_user,
            ).commit
        except CheckoutStopped:
            raise PrepareStopped() from None
        except CheckoutFailure as failure:
            raise PrepareFailure(failure.error_class, failure.message) from None
        except stage_attempts.LeaseLost:
            raise PrepareStopped() from None
    earlier = earlier_stages(ref.table, context, index)
    require_handoffs(envelope, earlier, index)
    variables = {"RELEVO_COMMIT": commit or "", **output_variables(earlier)}
    prepared = Prepared(commit, "", variables, earlier)
    sources = [stage for stage in earlier if stage.handoff is not None]
    if sources and config.build_user is not None:
        config.build_user.adopt(workspace)  # restored files are the workspace owner's
    if sources:
        from relevo_agent.handoff import HandoffFailure
        from relevo_agent.handoff.restore import Source, Stopped, restore_handoffs

        started = time.monotonic()
        try:
            result = restore_handoffs(
                [
                    Source(stage.name, stage.job_id, stage.handoff, stage.shard)
                    for stage in sources
                    if stage.handoff is not None
                ],
                workspace,
                handoff_cache(config),
                emit,
                cancel,
                this_job=ref.job_id,
            )
        except Stopped:
            raise PrepareStopped() from None
        except HandoffFailure as failure:
            raise PrepareFailure(failure.error_class, failure.message) from None
        if cancel.is_set():
            raise PrepareStopped()
        prepared.known = result.known or {}
        first = sources[0].handoff
        assert first is not None  # sources: the earlier stages with a handoff
        prepared.restored = {
            "attempt": ref.attempt,
            "agent_id": ref.agent_id,
            "from_stages": list(result.from_stages),
            "files": result.files,
            "bytes": result.bytes,
            "restored_bytes": result.restored_bytes,
            "cached_bytes": result.cached_bytes,
            "present_bytes": result.present_bytes,
            "digest": result.digest,
            "seconds": round(time.monotonic() - started, 3),
            "cross_region_bytes": cross_region(config, first.manifest, result.restored_bytes),
        }
    prepared.precondition = reconcile.precondition_version(
        workspace, envelope.ref, commit, plan.inputs, pinned=envelope.checkout is not None
    )
    return prepared


def require_handoffs(envelope: JobEnvelope, earlier: list[EarlierStage], index: int) -> None:
    """Every earlier stage that hands files on (each shard of one with shards) left them: a
    succeeded run on record, with its handoff's summary."""
    found: dict[str, list[EarlierStage]] = {}
    for stage in earlier:
        found.setdefault(stage.name, []).append(stage)
    for declared in envelope.stages[:index]:
        runs = found.get(declared.name, [])
        if not declared.handoff and not any(run.declared for run in runs):
            continue
        shards = range(declared.shard_count) if declared.sharded else [None]
        missing = sorted(
            set(shards) - {run.shard for run in runs}, key=lambda shard: -1 if shard is None else shard
        )
        if missing:
            which = (
                declared.name
                if missing == [None]
                else f"{declared.name} (shard {', '.join(str(shard) for shard in missing)})"
            )
            raise PrepareFailure(
                ErrorClass.HANDOFF_GONE,
                f"stage {which} hands files on, but no succeeded run of it is on record for this job or the "
                "job it "
                f"reruns ({envelope.retry_of or 'none'}): run the job from {declared.name}",
            )
        for stage in runs:
            if stage.handoff is None:
                raise PrepareFailure(
                    ErrorClass.HANDOFF_MISSING,
                    f"stage {stage.label} of {stage.job_id} declares handoff "
                    f"{', '.join(stage.declared) or '(its plan then)'} but "
                    "handed nothing on (its success was decided without them): run it again",
                )


_REGIONS: dict[str, str] = {}


def bucket_region_of(uri: str) -> str | None:
    """The AWS region of the bucket of an s3:// URI (GetBucketLocation, once per bucket)."""
    from relevo_agent.artifacts import bucket_region

    bucket = uri.removeprefix("s3://").split("/", 1)[0]
    if bucket not in _REGIONS:
        try:
            _REGIONS[bucket] = bucket_region(bucket)
        except Exception:  # noqa: BLE001 - unknown: no claim either way
            return None
    return _REGIONS[bucket]


def cross_region(config: AgentConfig, uri: str, moved: int) -> int | None:
    """Of `moved` bytes between this Mac and the bucket of `uri`, those that crossed AWS regions;
    None when this Mac's region is not known (config network_region)."""
    if config.location_region is None:
        return None
    region = bucket_region_of(uri)
    if region is None:
        return None
    return moved if region != config.location_region else 0
