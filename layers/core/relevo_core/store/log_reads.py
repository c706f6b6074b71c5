"""Access pattern: a job's log read back: each partition (store/log_chunks) a Query by seq range,
the partitions read side by side and merged by time into one order that keeps each one's own, the
bodies kept in S3 read in and verified (store/log_bodies)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict

from relevo_core.aws import client, in_this_context
from relevo_core.models import job_objects
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.job_objects import JobPrefix
from relevo_core.store import log_bodies
from relevo_core.store.codec import from_attributes
from relevo_core.store.jobs import get_envelope
from relevo_core.store.keys import log_sk
from relevo_core.store.log_chunks import (
    PARALLEL_BODIES,
    LogChunk,
    LogPart,
    chunk_stored,
    partition_pk,
)

# Where a reader stands in a job's log: for each partition, the seq of its first chunk after that
# point (a partition not named: 0, all of it after). One position serves both directions: the
# chunks before it are those with smaller seqs.
Position = dict[LogPart, int]
# Partitions read side by side.
PARALLEL_PARTS = 8
# What a page of reads returns at most (at least one chunk), as DynamoDB's 1 MB page bounded it
# when every chunk was inline; an API answer stays far below Lambda's 6 MB.
PAGE_MAX_BYTES = 1024 * 1024


def job_home(table: str, job_id: str) -> JobPrefix | None:
    """The job's prefix (its envelope's artifact_uri), where its log bodies must be; None once
    the job record is gone."""
    try:
        return JobPrefix.of(get_envelope(table, job_id).artifact_uri)
    except RelevoError as exc:
        if exc.code is ErrorCode.JOB_NOT_FOUND:
            return None
        raise


def _with_bodies(
    table: str, job_id: str, chunks: list[tuple[LogPart, LogChunk]], home: JobPrefix | None
) -> list[LogChunk]:
    """The chunks (each with the partition it was read from) with the text of each body kept in S3
    read in (side by side), each verified against the sha256 its item recorded; a body gone or
    altered reads as a line saying so. A body's key is its writer's choice (a uuid, not
    derivable): only one under the job's own prefix `home` is read (relevo_core.models.job_objects), any
    other reads as a line saying so. `home` None: read from the job record, once, when a chunk
    has a body."""
    stored = [chunk for _, chunk in chunks if chunk.body]
    if stored and home is None:
        home = job_home(table, job_id)

    def filled(entry: tuple[LogPart, LogChunk]) -> LogChunk:
        part, chunk = entry
        if chunk.body is None or chunk.body_sha256 is None:
            return chunk
        try:
            if home is None:
                raise log_bodies.BodyMissing(f"job {job_id} is gone")
            # The record's key is the partition it was read from (never its `shard` attribute).
            object_key = job_objects.object_key(
                home, chunk.body, (partition_pk(job_id, part), log_sk(chunk.seq))
            )
            text = log_bodies.get_body(home.bucket, object_key, chunk.body_sha256)
        except log_bodies.BodyMissing as missing:
            text = f"[relevo] chunk {chunk.seq} of this log cannot be shown: {missing}\n"
        except RelevoError as refused:
            if refused.code is not ErrorCode.LOCATION_OUTSIDE_JOB:
                raise
            text = (
                f"[relevo] chunk {chunk.seq} of this log cannot be shown: its body is not one of the "
                f"job's objects ({refused.code.value})\n"
            )
        return chunk.model_copy(update={"data": text})

    if len(stored) <= 1:
        return [filled(chunk) for chunk in chunks]
    with ThreadPoolExecutor(
        max_workers=min(PARALLEL_BODIES, len(stored)), thread_name_prefix="log-read"
    ) as pool:
        return list(pool.map(in_this_context(filled), chunks))


class LogPage(BaseModel):
    model_config = ConfigDict(frozen=True)

    chunks: list[LogChunk]
    # The seq to ask for next (`from_seq`), or None when the stored log ends here.
    next_seq: int | None


def _query(
    table: str,
    job_id: str,
    part: LogPart,
    limit: int,
    from_seq: int | None = None,
    before_seq: int | None = None,
) -> tuple[list[LogChunk], bool]:
    """Up to `limit` chunks of one partition: from `from_seq` on, ascending, or (from_seq None)
    before `before_seq` (the end when None), descending; and whether it may hold more."""
    condition, values = "pk = :pk", {":pk": {"S": partition_pk(job_id, part)}}
    if from_seq is not None:
        condition += " AND sk >= :from"
        values[":from"] = {"S": log_sk(max(0, from_seq))}
    elif before_seq is not None:
        condition += " AND sk < :before"
        values[":before"] = {"S": log_sk(max(0, before_seq))}
    response = client("dynamodb").query(
        TableName=table,
        KeyConditionExpression=condition,
        ExpressionAttributeValues=values,
        ScanIndexForward=from_seq is not None,
        Limit=limit,
        ConsistentRead=True,
    )
    chunks = [LogChunk.model_validate(from_attributes(item)) for item in response.get("Items", [])]
    # A page that hit its Limit has a LastEvaluatedKey even when nothing follows; read back, seq 0 is the
    # start.
    more = "LastEvaluatedKey" in response and not (from_seq is None and chunks and chunks[-1].seq == 0)
    return chunks, more


def _each_part(parts: list[LogPart], read: Callable[[LogPart], Any]) -> dict[LogPart, Any]:
    if len(parts) == 1:
        return {parts[0]: read(parts[0])}
    with ThreadPoolExecutor(
        max_workers=min(PARALLEL_PARTS, len(parts)), thread_name_prefix="log-part"
    ) as pool:
        return dict(zip(parts, pool.map(in_this_context(read), parts), strict=True))


class MergedPage(BaseModel):
    """A page of a job's log merged across its partitions, in time order (ties: partition order),
    each partition's own order kept. `start`: the position before the page's first chunk;
    `after[i]`: the position after chunk i; `end`: the position after the page."""

    model_config = ConfigDict(frozen=True)

    chunks: list[LogChunk]
    after: list[dict[Any, int]]
    start: dict[Any, int]
    end: dict[Any, int]
    # Forward: chunks after `end` are stored already. Backward: chunks before `start` are stored.
    more: bool


def _merge(
    parts: list[LogPart], found: dict[LogPart, tuple[list[LogChunk], bool]], limit: int, backward: bool
) -> tuple[list[tuple[LogPart, LogChunk]], bool]:
    """Chunks of the partitions' reads in merged order (backward: from the newest), at most `limit`
    and PAGE_MAX_BYTES (at least one). A partition that may hold more than was read stops the
    merge once its read is used up: its next chunk may come first. Also: whether anything read or
    readable is left."""
    rank = {part: index for index, part in enumerate(parts)}
    heads = {part: deque(found[part][0]) for part in parts}
    taken: list[tuple[LogPart, LogChunk]] = []
    total = 0
    while len(taken) < limit:
        if any(found[part][1] and not heads[part] for part in parts):
            break
        live = [part for part in parts if heads[part]]
        if not live:
            break
        order = lambda part: (heads[part][0].at, rank[part])  # noqa: E731
        part = max(live, key=order) if backward else min(live, key=order)
        chunk = heads[part][0]
        if taken and total + chunk.byte_size > PAGE_MAX_BYTES:
            break
        heads[part].popleft()
        taken.append((part, chunk))
        total += chunk.byte_size
    left = any(heads[part] or found[part][1] for part in parts)
    return (list(reversed(taken)) if backward else taken), left


def _walk(start: Position, taken: list[tuple[LogPart, LogChunk]]) -> list[dict[Any, int]]:
    position, after = dict(start), []
    for part, chunk in taken:
        position[part] = chunk.seq + 1
        after.append(dict(position))
    return after


def read_forward(
    table: str,
    job_id: str,
    parts: list[LogPart],
    position: Position,
    limit: int = 100,
    home: JobPrefix | None = None,
) -> MergedPage:
    """The chunks after `position`, merged by time across `parts`: at most `limit` and
    PAGE_MAX_BYTES of text, bodies kept in S3 read in (only those under the job's prefix `home`;
    None: read from the job record when the page has a body). A follower that asks again from
    `end` sees every chunk once: each partition's seqs are contiguous, and each is read from its
    own seq on."""
    start = {part: position.get(part, 0) for part in parts}
    found = _each_part(parts, lambda part: _query(table, job_id, part, limit, from_seq=start[part]))
    taken, left = _merge(parts, found, limit, backward=False)
    after = _walk(start, taken)
    chunks = _with_bodies(table, job_id, taken, home)
    return MergedPage(
        chunks=chunks, after=after, start=start, end=after[-1] if after else start, more=left and bool(taken)
    )


def read_backward(
    table: str,
    job_id: str,
    parts: list[LogPart],
    position: Position | None = None,
    limit: int = 100,
    home: JobPrefix | None = None,
) -> MergedPage:
    """The last chunks before `position` (the end of the log when None), merged by time across
    `parts`, in ascending order: at most `limit` and PAGE_MAX_BYTES, bodies read in as
    read_forward does (`home`). `start` is where to page further back from; `more` whether
    anything is stored before it."""
    readable = [part for part in parts if position is None or position.get(part, 0) > 0]
    found: dict[LogPart, tuple[list[LogChunk], bool]] = dict.fromkeys(parts, ([], False))
    if readable:
        found.update(
            _each_part(
                readable,
                lambda part: _query(
                    table, job_id, part, limit, before_seq=None if position is None else position[part]
                ),
            )
        )
    taken, left = _merge(parts, found, limit, backward=True)
    # Where the page ends: the given position, or after each partition's newest chunk.
    end = {
        part: (
            position.get(part, 0)
            if position is not None
            else (found[part][0][0].seq + 1 if found[part][0] else 0)
        )
        for part in parts
    }
    start = dict(end)
    for part, chunk in reversed(taken):
        start[part] = chunk.seq
    after = _walk(start, taken)
    chunks = _with_bodies(table, job_id, taken, home)
    return MergedPage(chunks=chunks, after=after, start=start, end=end, more=left)


def stored_after(table: str, job_id: str, position: Position) -> bool:
    """Whether any partition of `position` holds a chunk at or after it."""
    parts = list(position)
    return any(_each_part(parts, lambda part: chunk_stored(table, job_id, position[part], part)).values())


def read_chunks(
    table: str,
    job_id: str,
    from_seq: int = 0,
    limit: int = 100,
    home: JobPrefix | None = None,
    part: LogPart = None,
) -> LogPage:
    """Page forward through one partition (the job's own by default): chunks with seq >= from_seq,
    at most `limit` and PAGE_MAX_BYTES of text, bodies kept in S3 read in. `home`: the job's
    prefix, when the caller has read its envelope already (else read from the job record when a
    body is to be read)."""
    page = read_forward(table, job_id, [part], {part: from_seq}, limit, home)
    return LogPage(chunks=page.chunks, next_seq=page.end[part] if page.more else None)
