"""What a job started from a later stage (a rerun --from-stage, a dead-letter redrive) stands on:
the stages it skips were run by the job it retries, and only those that succeeded there count."""

from __future__ import annotations

from relevo_core.models.errors import RelevoError
from relevo_core.store.jobs import get_envelope
from relevo_core.store.stage_outcomes import succeeded_indexes

# A rerun of a rerun of a rerun…: past this many earlier jobs, skipped stages are not counted.
MAX_LINEAGE = 8


def succeeded_stages(table: str, job_id: str, depth: int = 0) -> set[str]:
    """Names of the stages that succeeded for `job_id`: in its own run, or (for the stages it
    skipped) in the job it retries, and so on back."""
    try:
        envelope = get_envelope(table, job_id)
    except RelevoError:
        return set()  # deleted: nothing is known to have succeeded
    first = envelope.first_stage_index
    done = {
        envelope.stages[index].name
        for index in succeeded_indexes(table, job_id, range(first, len(envelope.stages)))
    }
    if first > 0 and envelope.retry_of and depth < MAX_LINEAGE:
        earlier = succeeded_stages(table, envelope.retry_of, depth + 1)
        done |= {stage.name for stage in envelope.stages[:first] if stage.name in earlier}
    return done


def last_successful_before(
    table: str, previous_job_id: str, stage_names: list[str], first_index: int
) -> str | None:
    """The last successful stage of a job that skips stage_names[:first_index], standing on
    `previous_job_id`: the last of the skipped stages up to which every one succeeded there."""
    if first_index == 0:
        return None
    done = succeeded_stages(table, previous_job_id)
    last = None
    for name in stage_names[:first_index]:
        if name not in done:
            break
        last = name
    return last
