"""One page of a job's output as `GET /jobs/{id}/logs` answers it: the job's status, its stages'
marks and why it waits, read from the job view before the chunks (relevo_core.jobs.logs reads
those), so that a page saying the job ended has every chunk written before it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from relevo_core.jobs.logs import chunk_view, cursor_position, cursor_text, log_places, stage_marks
from relevo_core.jobs.view import job_items_to_view, waiting_reason
from relevo_core.models.requests import LogQuery
from relevo_core.models.status import JobStatus
from relevo_core.store.jobs import query_job_items
from relevo_core.store.log_reads import read_backward, read_forward, stored_after


def log_page(table: str, job_id: str, query: LogQuery, now: datetime | None = None) -> dict[str, Any]:
    """One page of the job's output, with where to go next in either direction.

    `next_seq`: the from_seq of the next forward page (the seq after the last chunk returned).
    `before_seq`: the before_seq of the next backward page, or None at the start of the log.
    `more`: chunks from next_seq on are already stored (read again at once rather than wait).
    `status` / `terminal`: the job's status, and `stages` each stage's state (stage_marks), read
    before the chunks: a stage that ended on this page has all its output stored. `waiting_stage`
    the stage its approval gate holds back, while it waits there; `queue_reason` / `queue_detail`
    why it waits for its project or an agent (as GET /jobs/{id} says it)."""
    items = query_job_items(table, job_id)
    view = job_items_to_view(items)
    status = JobStatus(view["status"])
    reason, detail, _ = waiting_reason(table, view, now or datetime.now(UTC), items)
    parts, home = log_places(items)
    if query.before_seq is None:
        start = cursor_position(query.from_seq or 0)
        page = read_forward(table, job_id, parts, start, limit=query.limit, home=home)
        before_seq = cursor_text(page.start) if any(page.start.values()) else None
        more = page.more
    else:
        page = read_backward(table, job_id, parts, cursor_position(query.before_seq), query.limit, home=home)
        before_seq = cursor_text(page.start) if page.more else None
        more = stored_after(table, job_id, page.end)
    return {
        "job_id": job_id,
        "status": status.value,
        "terminal": status.terminal,
        # While the job waits at its approval gate: the stage the gate holds back.
        "waiting_stage": view["waiting_stage"],
        "queue_reason": reason,
        "queue_detail": detail,
        "region_affinity": view["region_affinity"],
        "stages": [stage_marks(stage, view["approval_decision"]) for stage in view["stages"]],
        "chunks": [chunk_view(chunk, after) for chunk, after in zip(page.chunks, page.after, strict=True)],
        "next_seq": cursor_text(page.end),
        "before_seq": before_seq,
        "more": more,
    }
