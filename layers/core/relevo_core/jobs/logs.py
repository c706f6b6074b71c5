"""A job's output as operators read it: `GET /jobs/{id}/logs` pages forward (`from_seq`) or back
(`before_seq`) through the stored chunks, and the job view shows the last lines (`log_tail`).

Every read is a Query on the job's `LOGS#` partition by seq range, never a scan. Chunks are
stored already masked by the agent, and are returned as stored. The seqs of a job are contiguous
(a writer only takes the seq after one that exists, see store/log_chunks.py), so a follower that
asks for `next_seq` again and again sees every chunk exactly once. The job's status and its
stages' states are read before the chunks: when a page says the job is terminal (or a stage
ended) and no more chunks are stored, the follower has seen everything that was written before
(an agent stores a stage's last output before it reports the stage's end).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from relevo_core.job_objects import JobPrefix
from relevo_core.jobs.handoff_sources import context_of
from relevo_core.models.requests import LogQuery
from relevo_core.models.status import JobStatus
from relevo_core.store.jobs import query_job_items
from relevo_core.store.log_chunks import LogChunk, chunk_stored, read_chunks, read_chunks_before

# The agent runs each command with stderr merged into stdout (executor.py), and adds its own lines
# (upload progress) to the same stream: every chunk is both, interleaved in the order written.
STREAM = "combined"

TAIL_LINES = 200
# The tail is part of the job view (one API response): bounded however long the lines are.
TAIL_MAX_CHARS = 256 * 1024
TAIL_MAX_LINE_CHARS = 4096
_TAIL_PAGE = 50


def chunk_view(chunk: LogChunk) -> dict[str, Any]:
    return {
        "seq": chunk.seq,
        "stage": chunk.stage,
        "attempt": chunk.attempt,
        "agent_id": chunk.agent_id,
        # A stage with shards: which shard wrote it (its index; the page's stages give its label).
        "shard": chunk.shard,
        "stream": STREAM,
        "text": chunk.data,
        "written_at": chunk.written_at,
    }


def _failed_attempts(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"attempt": entry.get("attempt"), "agent": entry.get("agent") or entry.get("agent_id"), "error": entry.get("error")}
        for entry in run["attempts_log"]
    ]


def stage_marks(stage: dict[str, Any]) -> dict[str, Any]:
    """What a reader of the log needs of a stage to mark where its output begins and ends: its
    state, where it ran, how it ended, and each failed attempt's error; for a stage with shards,
    the same of each shard, with its label (its chunks carry its index)."""
    return {
        "name": stage["name"],
        "index": stage["index"],
        "status": stage["status"],
        "attempt": stage["attempt"],
        "agent_id": stage["agent_id"],
        "exit_code": stage["exit_code"],
        "error_class": stage["error_class"] or None,
        "reused_from": stage["reused_from"],
        "warning": stage.get("warning"),
        "failed_attempts": _failed_attempts(stage),
        "shards": [
            {
                "shard": shard["shard"],
                "label": shard["label"],
                "status": shard["status"],
                "attempt": shard["attempt"],
                "agent_id": shard["agent_id"],
                "exit_code": shard["exit_code"],
                "error_class": shard["error_class"] or None,
                "failed_attempts": _failed_attempts(shard),
            }
            for shard in stage.get("shards") or []
        ],
    }


def log_page(table: str, job_id: str, query: LogQuery, now: datetime | None = None) -> dict[str, Any]:
    """One page of the job's output, with where to go next in either direction.

    `next_seq`: the from_seq of the next forward page (the seq after the last chunk returned).
    `before_seq`: the before_seq of the next backward page, or None at the start of the log.
    `more`: chunks from next_seq on are already stored (read again at once rather than wait).
    `status` / `terminal`: the job's status, and `stages` each stage's state (stage_marks), read
    before the chunks: a stage that ended on this page has all its output stored. `waiting_stage`
    the stage its approval gate holds back, while it waits there; `queue_reason` / `queue_detail`
    why it waits for its project or an agent (as GET /jobs/{id} says it)."""
    from relevo_core.jobs.view import job_items_to_view, waiting_reason  # the job view shows this log's tail

    items = query_job_items(table, job_id)
    view = job_items_to_view(items)
    home = JobPrefix.of(context_of(items).envelope.artifact_uri)  # where the log's bodies must be
    status = JobStatus(view["status"])
    reason, detail, _ = waiting_reason(table, view, now or datetime.now(timezone.utc), items)
    if query.before_seq is None:
        start = query.from_seq or 0
        page = read_chunks(table, job_id, from_seq=start, limit=query.limit, home=home)
        chunks = page.chunks
        next_seq = chunks[-1].seq + 1 if chunks else start
        first = chunks[0].seq if chunks else start
        before_seq = first if first > 0 else None
        more = page.next_seq is not None
    else:
        page = read_chunks_before(table, job_id, query.before_seq, query.limit, home=home)
        chunks = page.chunks
        next_seq = chunks[-1].seq + 1 if chunks else 0
        before_seq = page.next_seq
        more = chunk_stored(table, job_id, next_seq)
    return {
        "job_id": job_id,
        "status": status.value,
        "terminal": status.terminal,
        # While the job waits at its approval gate: the stage the gate holds back.
        "waiting_stage": view["waiting_stage"],
        "queue_reason": reason,
        "queue_detail": detail,
        "region_affinity": view["region_affinity"],
        "stages": [stage_marks(stage) for stage in view["stages"]],
        "chunks": [chunk_view(chunk) for chunk in chunks],
        "next_seq": next_seq,
        "before_seq": before_seq,
        "more": more,
    }


def _clip(text: str) -> str:
    if len(text) <= TAIL_MAX_LINE_CHARS:
        return text
    return text[:TAIL_MAX_LINE_CHARS] + f" [… {len(text) - TAIL_MAX_LINE_CHARS} more characters]"


def split_lines(chunks: list[LogChunk]) -> list[dict[str, Any]]:
    """The lines of consecutive chunks, each with the seq of the chunk it starts in (and its shard,
    for a stage with shards). A line never joins the output of two attempts (or two shards): the
    end of one attempt's output ends its last line."""
    lines: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    owner: tuple[str, int, str, int | None] | None = None
    for chunk in chunks:
        if owner != (chunk.stage, chunk.attempt, chunk.agent_id, chunk.shard) and pending is not None:
            lines.append(pending)
            pending = None
        owner = (chunk.stage, chunk.attempt, chunk.agent_id, chunk.shard)
        parts = chunk.data.split("\n")
        for index, part in enumerate(parts):
            if pending is None:
                if index == len(parts) - 1 and not part:
                    break  # the chunk ended with a newline: no line has started
                pending = {"seq": chunk.seq, "stage": chunk.stage, "attempt": chunk.attempt, "text": "",
                           **({} if chunk.shard is None else {"shard": chunk.shard})}
            pending["text"] += part
            if index < len(parts) - 1:
                lines.append(pending)
                pending = None
    if pending is not None:
        lines.append(pending)
    return lines


def log_tail(table: str, job_id: str, lines: int = TAIL_LINES, home: JobPrefix | None = None) -> dict[str, Any]:
    """The last `lines` lines of the job's output, read back from the end of the log a page at a
    time until there are enough (or TAIL_MAX_CHARS were read). `truncated`: earlier output exists;
    `next_seq`: where `relevo job logs -f --from-seq` continues after what is shown."""
    chunks: list[LogChunk] = []
    before: int | None = None
    newlines = chars = 0
    while True:
        page = read_chunks_before(table, job_id, before, _TAIL_PAGE, home=home)
        chunks[:0] = page.chunks
        newlines += sum(chunk.data.count("\n") for chunk in page.chunks)
        chars += sum(len(chunk.data) for chunk in page.chunks)
        before = page.next_seq
        # One newline more than lines: the first line read may have started in an earlier chunk.
        if before is None or newlines > lines or chars >= TAIL_MAX_CHARS:
            break
    found = split_lines(chunks)
    if before is not None and found:
        found = found[1:]  # may be the end of a line that started in an unread chunk
    shown = found[-lines:] if lines else []
    return {
        "lines": [{**line, "text": _clip(line["text"])} for line in shown],
        "truncated": before is not None or len(found) > len(shown),
        "next_seq": chunks[-1].seq + 1 if chunks else 0,
    }
