"""A stage's handoff stored after its command (relevo_agent.handoff.store does the work): the
summary for its receipt, or None when the attempt is no longer held."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.attempt import StageRun
    from relevo_agent.config import AgentConfig
    from relevo_agent.prepare import Prepared
    from relevo_core.models.envelope import JobEnvelope
    from relevo_core.models.plan import StagePlan

log = logging.getLogger(__name__)


def store_stage_handoff(
    config: AgentConfig,
    run: StageRun,
    plan: StagePlan,
    workspace: Path,
    envelope: JobEnvelope,
    shipper: Any,
    prepared: Prepared,
) -> dict[str, Any] | None:
    """The summary for the receipt; None when the attempt is no longer held (the run is
    stopped). Raises HandoffFailure with the error class and why the stage fails."""
    from relevo_agent.artifacts import bucket_region
    from relevo_agent.handoff.store import store_handoff
    from relevo_agent.prepare import handoff_cache

    ref = run.ref

    def emit(line: str) -> None:
        line = shipper.masker.mask(line)
        log.info("%s/%s %s", ref.job_id, plan.name, line)
        shipper.line(line)

    try:
        region = bucket_region(envelope.artifact_uri.removeprefix("s3://").split("/", 1)[0])
    except Exception:  # noqa: BLE001 - the store itself says what is wrong with the bucket
        region = ""
    location = config.location_region
    try:
        summary = store_handoff(
            ref,
            plan.name,
            workspace,
            plan.handoff,
            envelope.artifact_uri,
            envelope.ttl,
            prepared.known,
            handoff_cache(config),
            emit,
            run.cancel,
            max_job_bytes=envelope.artifact_max_job_bytes,
            bucket_region=region,
            crosses_region=None if location is None or not region else region != location,
        )
    except stage_attempts.LeaseLost:
        emit("[relevo] handoff records refused: the attempt is no longer held")
        run.stop("lease_lost")
        return None
    summary_json: dict[str, Any] = summary.model_dump(mode="json")
    return summary_json
