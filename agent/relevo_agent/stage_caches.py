"""A stage's caches around its command (relevo_agent.caches does the work): restored into the
workspace (and the build user's home) after its checkout and handoffs, saved after the command as
its `save` says, each outcome on the stage record. A cache never fails the stage."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relevo_core.aws import call_budget
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.attempt import StageRun
    from relevo_agent.config import AgentConfig
    from relevo_agent.prepare import Prepared
    from relevo_core.models.capabilities import Capabilities
    from relevo_core.models.envelope import JobEnvelope
    from relevo_core.models.plan import StagePlan

log = logging.getLogger(__name__)


def restore_stage_caches(
    config: AgentConfig,
    capabilities: Capabilities | None,
    run: StageRun,
    plan: StagePlan,
    envelope: JobEnvelope,
    workspace: Path,
    prepared: Prepared,
    emit: Any,
) -> None:
    """The stage's caches restored into its workspace (and the build user's home), before its
    command; each outcome on the stage record. A cache never fails the stage: whatever is
    wrong with an entry is a miss (logged)."""
    from relevo_agent.caches import CacheContext, restore_caches
    from relevo_agent.prepare import handoff_cache

    facts: dict[str, str | None] = {}
    if capabilities is not None:
        detected = capabilities
        facts = {
            "os": detected.os,
            "arch": detected.arch,
            "macos": detected.macos,
            "xcode": detected.xcode,
            "xcode_build": detected.xcode_build,
            "sdk": detected.sdk,
        }
    build_user = config.build_user
    context = CacheContext(
        ref=run.ref,
        stage=plan.name,
        bucket=envelope.artifact_uri.removeprefix("s3://").split("/", 1)[0],
        project=envelope.project,
        region=envelope.region_affinity,
        workspace=workspace,
        home=build_user.home if build_user is not None else Path.home(),
        facts=facts,
        writable=envelope.cache_write,
        content_cache=handoff_cache(config),
        emit=emit,
        cancel=run.cancel,
        agent_id=config.agent_id,
        owner=build_user,
    )
    prepared.cache_context = context
    prepared.caches = restore_caches(plan.caches, context)
    if build_user is not None:
        build_user.adopt(workspace)  # restored files are the workspace owner's
    _record(run, prepared)


def save_stage_caches(run: StageRun, prepared: Prepared, succeeded: bool) -> None:
    from relevo_agent.caches import save_caches

    if not prepared.caches or prepared.cache_context is None or run.reason is not None:
        return
    save_caches(prepared.caches, prepared.cache_context, succeeded)
    _record(run, prepared)


def _record(run: StageRun, prepared: Prepared) -> None:
    outcomes = [cache.outcome.model_dump(mode="json") for cache in prepared.caches]
    try:
        with call_budget(min(5.0, max(0.5, run.lease.fence_in()))):
            stage_attempts.record_caches(run.ref, outcomes)
    except stage_attempts.LeaseLost:
        run.stop("lease_lost")
    except Exception as exc:  # noqa: BLE001 - the log says it; the stage goes on
        log.warning(
            "%s attempt %d: its caches' outcomes were not recorded (%s)",
            run.ref.job_id,
            run.ref.attempt,
            exc,
        )
