"""The build number a claimed stage runs with (RELEVO_BUILD_NUMBER), given by the claim route.

Given lazily, by the first claim of a stage that needs one (the project's build_number.stages),
not at intake: a job of a project without build numbers, and every stage that does not need one,
costs no call at all, where a number taken at intake would put a read and a contended
transaction on every trigger's path (and the job would keep a number it never used). The claim
route reads the job record anyway (fleet/claims): a job that has its number already, on a retry,
a later stage or another shard, gets it from there with no call; a stage that needs one and finds
none takes it (store/build_numbers: the counter read, one transaction), side by side with the job
session's mint and the dispatch's answer, so the claim's answer waits for no extra round trip in a
row. A rerun or redrive carries over the number of the job it retries: written on its record at
intake when that job had one (intake/triggers, recovery/dead_letters), or taken from that job's
record here when it got its number after the rerun was made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relevo_core.models.envelope import JobEnvelope
from relevo_core.store import build_numbers
from relevo_core.store.keys import BUILD_NUMBER_ATTRIBUTE, JOB_SK


def on_record(items: list[dict[str, Any]]) -> int | None:
    """The number on the job record among a job's items (store/jobs.query_job_items)."""
    record = next((item for item in items if item["sk"] == JOB_SK and str(item["pk"]).startswith("JOB#")), {})
    number = record.get(BUILD_NUMBER_ATTRIBUTE)
    return None if number is None else int(number)


def _given(table: str, envelope: JobEnvelope, floor: int) -> int:
    if envelope.retry_of is not None:
        earlier = build_numbers.job_build_number(table, envelope.retry_of)
        if earlier is not None:
            return build_numbers.carry_over(table, envelope.job_id, earlier)
    return build_numbers.allocate(table, envelope.project, envelope.job_id, floor)


def to_give(
    table: str, envelope: JobEnvelope, stage_index: int, items: list[dict[str, Any]]
) -> Callable[[], int] | None:
    """What gives the claimed stage its job's number, when that takes a call: the job has none on
    its record and the stage needs one. None otherwise (on_record says the number, if any)."""
    settings = envelope.build_number
    if settings is None or on_record(items) is not None:
        return None
    if envelope.stages[stage_index].name not in settings.stages:
        return None
    return lambda: _given(table, envelope, settings.floor)
