"""A job's output as operators read it: `GET /jobs/{id}/logs` pages forward (`from_seq`) or back
(`before_seq`) through the stored chunks, and the job view shows the last lines (`log_tail`).

A job's log is several partitions (store/log_chunks: its own, and one per shard), merged by time
into one order that keeps each partition's own; which partitions exist comes from the job's plan
(log_chunks.job_log_parts), never a scan. Every read is a Query per partition by seq range.
Chunks are stored already masked by the agent, and are returned as stored.

Where a reader stands is a cursor (`next_seq`, `before_seq`, each chunk's `next`): for each
partition, the seq of its first chunk after that point. For a job without shards it is the plain
seq it always was (an integer); with shards, `<own seq>,<stage>.<shard>:<seq>,...` (a string;
a partition not named has all its chunks after the point). Each partition's seqs are contiguous
(a writer only takes the seq after one that exists), so a follower that asks for `next_seq` again
and again sees every chunk exactly once. The job's status and its stages' states are read before
the chunks: when a page says the job is terminal (or a stage ended) and no more chunks are stored,
the follower has seen everything that was written before (an agent stores a stage's last output
before it reports the stage's end).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from relevo_core.job_objects import JobPrefix
from relevo_core.jobs.handoff_sources import context_of
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.requests import LOG_CURSOR, LogQuery
from relevo_core.models.status import JobStatus
from relevo_core.store.jobs import query_job_items
from relevo_core.store.log_chunks import (
    LogChunk,
    LogPart,
    Position,
    job_log_parts,
    read_backward,
    read_forward,
    stored_after,
)

# The agent runs each command with stderr merged into stdout (executor.py), and adds its own lines
# (upload progress) to the same stream: every chunk is both, interleaved in the order written.
STREAM = "combined"

TAIL_LINES = 200
# The tail is part of the job view (one API response): bounded however long the lines are.
TAIL_MAX_CHARS = 256 * 1024
TAIL_MAX_LINE_CHARS = 4096
_TAIL_PAGE = 50


def cursor_text(position: Position) -> int | str:
    """The cursor of a position: the job's own seq alone (an int) while no shard's is past 0."""
    own = position.get(None, 0)
    shards = sorted((part, seq) for part, seq in position.items() if part is not None and seq > 0)
    if not shards:
        return own
    return ",".join([str(own), *(f"{stage:02d}.{shard:02d}:{seq}" for (stage, shard), seq in shards)])


def cursor_position(cursor: int | str) -> Position:
    """The position a cursor names (LogQuery has checked its form: models/requests.LOG_CURSOR)."""
    text = str(cursor)
    if not re.fullmatch(LOG_CURSOR, text):
        raise RelevoError(
            ErrorCode.QUERY_INVALID, f"{text[:40]!r} is not a log cursor (next_seq or before_seq of a page)"
        )
    own, *shards = text.split(",")
    position: Position = {None: int(own)}
    for entry in shards:
        part, _, seq = entry.partition(":")
        stage, _, shard = part.partition(".")
        position[(int(stage), int(shard))] = int(seq)
    return position


def chunk_view(chunk: LogChunk, after: Position | None = None) -> dict[str, Any]:
    return {
        "seq": chunk.seq,
        # The cursor right after this chunk: where a reader that has shown it goes on from.
        **({} if after is None else {"next": cursor_text(after)}),
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
        {
            "attempt": entry.get("attempt"),
            "agent": entry.get("agent") or entry.get("agent_id"),
            "error": entry.get("error"),
            "at": entry.get("at"),
        }
        for entry in run["attempts_log"]
    ]


def stage_marks(stage: dict[str, Any], approval: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a reader of the log needs of a stage to mark where its output begins and ends: its
    state, where it ran, when its attempt started and ended, how it ended, and each failed
    attempt's error (and when it failed); for a stage with shards, the same of each shard, with
    its label (its chunks carry its index). A follower says a stage began once it is `running`
    (its command started), before any output. `approval`: the job's approval decision (a
    rejection says why the stage it held back never ran)."""
    rejected = (
        approval
        if approval and approval.get("decision") == "rejected" and approval.get("stage") == stage["name"]
        else None
    )
    return {
        "name": stage["name"],
        "index": stage["index"],
        "status": stage["status"],
        "attempt": stage["attempt"],
        "agent_id": stage["agent_id"],
        "started_at": stage.get("started_at"),
        "ended_at": stage.get("ended_at"),
        "exit_code": stage["exit_code"],
        "error_class": stage["error_class"] or None,
        "reused_from": stage["reused_from"],
        "warning": stage.get("warning"),
        "failed_attempts": _failed_attempts(stage),
        # The latest reconciliation: an attempt that decided an earlier one's effect, not ran.
        "reconciled": stage.get("reconciled"),
        "failed_shards": stage.get("failed_shards") or [],
        "rejected": {key: rejected.get(key) for key in ("actor", "reason", "at")} if rejected else None,
        "shards": [
            {
                "shard": shard["shard"],
                "label": shard["label"],
                "status": shard["status"],
                "attempt": shard["attempt"],
                "agent_id": shard["agent_id"],
                "started_at": shard.get("started_at"),
                "ended_at": shard.get("ended_at"),
                "exit_code": shard["exit_code"],
                "error_class": shard["error_class"] or None,
                "failed_attempts": _failed_attempts(shard),
                "reconciled": shard.get("reconciled"),
            }
            for shard in stage.get("shards") or []
        ],
    }


def log_places(items: list[dict[str, Any]]) -> tuple[list[LogPart], JobPrefix]:
    """Where the job's log is, from its record: its partitions (the plan's) and its prefix (where
    its log's bodies must be, relevo_core.job_objects)."""
    envelope = context_of(items).envelope
    return job_log_parts(envelope), JobPrefix.of(envelope.artifact_uri)


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


def _clip(text: str) -> str:
    if len(text) <= TAIL_MAX_LINE_CHARS:
        return text
    return text[:TAIL_MAX_LINE_CHARS] + f" [… {len(text) - TAIL_MAX_LINE_CHARS} more characters]"


def split_lines(chunks: list[LogChunk]) -> list[dict[str, Any]]:
    """The lines of consecutive chunks, each with the seq of the chunk it starts in (and its shard,
    for a stage with shards). A line never joins the output of two attempts or two shards: each
    shard's line is pieced together from its own chunks (the shards' chunks interleave), and the
    end of one attempt's (or stage's) output ends its last line. A line takes its place where it ends."""
    lines: list[dict[str, Any]] = []
    # The line under way of each writer: (stage, shard) -> ((attempt, agent), line).
    pending: dict[tuple[str, int | None], tuple[tuple[int, str], dict[str, Any]]] = {}
    for chunk in chunks:
        writer, attempt = (chunk.stage, chunk.shard), (chunk.attempt, chunk.agent_id)
        # Another stage's output, or another attempt's, ends a line; a sibling shard's does not.
        for other in [
            w for w in pending if w[0] != chunk.stage or (w == writer and pending[w][0] != attempt)
        ]:
            lines.append(pending.pop(other)[1])
        parts = chunk.data.split("\n")
        for index, part in enumerate(parts):
            if writer not in pending:
                if index == len(parts) - 1 and not part:
                    break  # the chunk ended with a newline: no line has started
                pending[writer] = (
                    attempt,
                    {
                        "seq": chunk.seq,
                        "stage": chunk.stage,
                        "attempt": chunk.attempt,
                        "text": "",
                        **({} if chunk.shard is None else {"shard": chunk.shard}),
                    },
                )
            pending[writer][1]["text"] += part
            if index < len(parts) - 1:
                lines.append(pending.pop(writer)[1])
    lines.extend(line for _, line in pending.values())
    return lines


def log_tail(
    table: str,
    job_id: str,
    parts: list[LogPart] | None = None,
    lines: int = TAIL_LINES,
    home: JobPrefix | None = None,
) -> dict[str, Any]:
    """The last `lines` lines of the job's output (its partitions merged: `parts`, the job's own
    alone when None), read back from the end of the log a page at a time until there are enough
    (or TAIL_MAX_CHARS were read); bodies only under the job's prefix `home` (read from the job
    record when None). `truncated`: earlier output exists; `next_seq`: the cursor
    `relevo job logs -f --from-seq` continues from after what is shown."""
    parts = parts or [None]
    chunks: list[LogChunk] = []
    before: Position | None = None
    end: Position | None = None
    newlines = chars = 0
    more = True
    while more:
        page = read_backward(table, job_id, parts, before, _TAIL_PAGE, home=home)
        end = page.end if end is None else end
        chunks[:0] = page.chunks
        newlines += sum(chunk.data.count("\n") for chunk in page.chunks)
        chars += sum(len(chunk.data) for chunk in page.chunks)
        before, more = page.start, page.more
        # One newline more than lines: the first line read may have started in an earlier chunk.
        if newlines > lines or chars >= TAIL_MAX_CHARS:
            break
    found = split_lines(chunks)
    if more and found:
        found = found[1:]  # may be the end of a line that started in an unread chunk
    shown = found[-lines:] if lines else []
    return {
        "lines": [{**line, "text": _clip(line["text"])} for line in shown],
        "truncated": more or len(found) > len(shown),
        "next_seq": cursor_text(end or {}),
    }
