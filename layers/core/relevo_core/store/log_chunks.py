"""Access pattern: a job's output as ordered log chunks, one item per chunk under its log
partition: `LOGS#{job}` for the stages without shards, `LOGS#{job}/{stage}/{shard}` for each shard
of a stage with shards (keys.log_partition: one partition takes 1,000 write units a second, and
shards writing side by side would share it and its seq).

A small chunk's text is in its item. A large one's body is an S3 object (store/log_bodies: one
partition key takes 1,000 write units a second, about 0.5 MB/s of inline text in transactions),
and its item is an index entry: the object, its sha256 and size. The items a writer has ready are
written in one transaction, with the one ConditionCheck that fences them all.

`seq` is strictly increasing per partition across attempts and agents. A writer starts after the
highest stored seq and allocates each seq with a conditional put (`attribute_not_exists`), so two
writers can never store the same seq; a writer that loses a race (an earlier attempt's last flush)
re-reads the tail and moves on. Every put is fenced on the writer still holding its stage attempt
(a ConditionCheck on the stage's or the shard's record in the same transaction), so a zombie agent
cannot add output after its successor took over. A partition's `written_at` never goes back (a
writer stamps at least the time of the partition's last chunk), so the job's partitions merge by
time into one order that keeps each partition's own (read_forward, read_backward). Chunks expire
through the table's TTL attribute at the job's `log_ttl` (its envelope: the stack's
LogRetentionDays after the job was created).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from relevo_core import job_objects
from relevo_core.aws import client, in_this_context
from relevo_core.job_objects import JobPrefix
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.store import log_bodies
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.conditional import transaction_cancellation
from relevo_core.store.jobs import get_envelope
from relevo_core.store.keys import key, log_pk, log_sk
from relevo_core.store.stage_attempts import LeaseLost, StageRef, holds_attempt_check

if TYPE_CHECKING:
    from relevo_core.models.envelope import JobEnvelope

# A log partition of a job: None for its own (stages without shards), (stage index, shard) for a shard's.
LogPart = tuple[int, int] | None
# Where a reader stands in a job's log: for each partition, the seq of its first chunk after that
# point (a partition not named: 0, all of it after). One position serves both directions: the
# chunks before it are those with smaller seqs.
Position = dict[LogPart, int]
# Partitions read side by side.
PARALLEL_PARTS = 8

# DynamoDB items are at most 400 KB: a chunk's text (UTF-8) kept in its item stays below with room
# for the rest. A writer without an artifact prefix (no S3 for bodies) keeps every chunk inline.
MAX_INLINE_CHUNK_BYTES = 300 * 1024
# A chunk up to this size is kept in its item (its writes, 2 units a KB, stay cheap at the rates
# a person reads); a larger one's body goes to S3.
INLINE_MAX_BYTES = 16 * 1024
# A body in S3, at most: readers return about this much of a log a page (PAGE_MAX_BYTES).
MAX_CHUNK_BYTES = 1024 * 1024
# What a page of reads returns at most (at least one chunk), as DynamoDB's 1 MB page bounded it
# when every chunk was inline; an API answer stays far below Lambda's 6 MB.
PAGE_MAX_BYTES = 1024 * 1024
# Index items written in one transaction (with its ConditionCheck): DynamoDB allows 100 items.
MAX_BATCH = 32
# Bodies uploaded side by side.
PARALLEL_BODIES = 4


class LogChunk(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str
    seq: int = Field(ge=0)
    stage: str
    attempt: int
    agent_id: str
    # The shard that wrote it, for a stage with shards (None: a stage without).
    shard: int | None = None
    # The text, for a chunk kept in its item ("" for one whose body is in S3 until it is read).
    data: str = ""
    written_at: str
    # A body in S3: s3://bucket/key, its sha256 and its size in bytes (store/log_bodies).
    body: str | None = None
    body_sha256: str | None = None
    size: int | None = None

    @property
    def byte_size(self) -> int:
        return self.size if self.size is not None else len(self.data.encode())

    @property
    def at(self) -> datetime:
        return datetime.fromisoformat(self.written_at)


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
    derivable): only one under the job's own prefix `home` is read (relevo_core.job_objects), any
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
            object_key = job_objects.object_key(home, chunk.body, (_pk(job_id, part), log_sk(chunk.seq)))
            text = log_bodies.get_body(home.bucket, object_key, chunk.body_sha256)
        except log_bodies.BodyMissing as missing:
            text = f"[relevo] chunk {chunk.seq} of this log cannot be shown: {missing}\n"
        except RelevoError as refused:
            if refused.code is not ErrorCode.LOCATION_OUTSIDE_JOB:
                raise
            text = f"[relevo] chunk {chunk.seq} of this log cannot be shown: its body is not one of the job's objects ({refused.code.value})\n"
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


def job_log_parts(envelope: JobEnvelope) -> list[LogPart]:
    """The job's log partitions, from its frozen plan (never a scan): its own, then each shard's of
    each stage with shards, in plan order (the order that breaks ties of time when merging)."""
    return [None] + [
        (index, shard)
        for index, stage in enumerate(envelope.stages)
        if stage.sharded
        for shard in range(stage.shard_count)
    ]


def _pk(job_id: str, part: LogPart) -> str:
    return log_pk(job_id) if part is None else log_pk(job_id, *part)


def _tail(table: str, job_id: str, part: LogPart = None) -> tuple[int, datetime | None]:
    """(highest stored seq, its written_at) of the partition; (-1, None) when it has no output yet."""
    response = client("dynamodb").query(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": _pk(job_id, part)}},
        ProjectionExpression="seq, written_at",
        ScanIndexForward=False,
        Limit=1,
        ConsistentRead=True,
    )
    items = response.get("Items", [])
    if not items:
        return -1, None
    return int(items[0]["seq"]["N"]), datetime.fromisoformat(items[0]["written_at"]["S"])


def last_seq(table: str, job_id: str, part: LogPart = None) -> int:
    """The highest stored seq of the partition (the job's own by default), -1 when it has no output yet."""
    return _tail(table, job_id, part)[0]


def chunk_stored(table: str, job_id: str, seq: int, part: LogPart = None) -> bool:
    """Whether chunk `seq` of the partition is stored (a consistent read of its key only)."""
    response = client("dynamodb").get_item(
        TableName=table,
        Key=key(_pk(job_id, part), log_sk(seq)),
        ProjectionExpression="seq",
        ConsistentRead=True,
    )
    return "Item" in response


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
    condition, values = "pk = :pk", {":pk": {"S": _pk(job_id, part)}}
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
    # A page that hit its Limit has a LastEvaluatedKey even when nothing follows; read back, seq 0 is the start.
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


class ChunkWriter:
    """Appends one attempt's output to its job's log. Not thread-safe: one shipper thread owns it.
    `artifact_uri`: the job's prefix, where large chunks' bodies go (None: every chunk inline)."""

    def __init__(self, ref: StageRef, stage: str, expires_at: int, artifact_uri: str | None = None) -> None:
        self.ref = ref
        self.stage = stage
        # Epoch seconds, the chunks' TTL attribute: the job envelope's log_expires_at.
        self.expires_at = expires_at
        self.artifact_uri = artifact_uri
        # Its log partition: the job's own, or its shard's.
        self.part: LogPart = None if ref.shard is None else (ref.stage_index, ref.shard)
        self._next: int | None = None
        # The newest written_at of the partition: a chunk is never stamped earlier (a clock stepped
        # back, another Mac's skew), so that merging partitions by time keeps each one's order.
        self._last_at: datetime | None = None
        # Seqs found taken by another writer of the partition (each one a refused transaction).
        self.collisions = 0
        # What was written, for the bench and the tests that count it: transactions, and bodies.
        self.transactions = 0
        self.bodies = 0

    @property
    def max_chunk_bytes(self) -> int:
        return MAX_CHUNK_BYTES if self.artifact_uri else MAX_INLINE_CHUNK_BYTES

    def append(self, data: str, now: datetime) -> int:
        """Store one chunk; returns its seq. Raises LeaseLost when the attempt is no longer held."""
        return self.append_many([data], now)[-1]

    def append_many(self, texts: list[str], now: datetime) -> list[int]:
        """Store chunks in order (large ones' bodies first, side by side, then every index item in
        transactions of MAX_BATCH); returns their seqs. LeaseLost once the attempt is no longer
        held: nothing of a refused transaction is shown (a body stored for it stays unnamed)."""
        entries = self._entries(texts)
        seqs: list[int] = []
        for start in range(0, len(entries), MAX_BATCH):
            seqs += self._write(entries[start : start + MAX_BATCH], now)
        return seqs

    def _entries(self, texts: list[str]) -> list[dict[str, Any]]:
        """Each chunk's item fields besides its key: its text, or the body stored in S3."""
        encoded = [text.encode() for text in texts]
        large = [i for i, data in enumerate(encoded) if self.artifact_uri and len(data) > INLINE_MAX_BYTES]
        entries: list[dict[str, Any]] = [{"data": text} for text in texts]

        def store(index: int) -> None:
            assert self.artifact_uri is not None
            bucket, object_key = log_bodies.body_key(self.artifact_uri, self.stage, self.ref.attempt)
            digest = log_bodies.put_body(bucket, object_key, encoded[index])
            entries[index] = {
                "body": f"s3://{bucket}/{object_key}",
                "body_sha256": digest,
                "size": len(encoded[index]),
            }

        if len(large) == 1:
            store(large[0])
        elif large:
            with ThreadPoolExecutor(
                max_workers=min(PARALLEL_BODIES, len(large)), thread_name_prefix="log-body"
            ) as pool:
                list(pool.map(in_this_context(store), large))
        self.bodies += len(large)
        return entries

    def _write(self, entries: list[dict[str, Any]], now: datetime) -> list[int]:
        if self._next is None:
            top, self._last_at = _tail(self.ref.table, self.ref.job_id, self.part)
            self._next = top + 1
        at = now if self._last_at is None else max(now, self._last_at)
        while True:
            first = self._next
            try:
                self._put(first, entries, at)
            except ClientError as exc:
                cancellation = transaction_cancellation(exc)
                if cancellation is None:
                    raise
                if cancellation.condition_failed(len(entries)):
                    raise LeaseLost(
                        f"{self.ref.job_id} stage {self.ref.stage_index} attempt {self.ref.attempt}"
                    ) from exc
                if not any(cancellation.condition_failed(i) for i in range(len(entries))):
                    raise
                # Another writer (an earlier attempt's last flush) took one of these seqs:
                # continue after what is stored.
                self.collisions += 1
                top, stored_at = _tail(self.ref.table, self.ref.job_id, self.part)
                self._next = max(first + 1, top + 1)
                at = at if stored_at is None else max(at, stored_at)
                continue
            self._next = first + len(entries)
            self._last_at = at
            return list(range(first, self._next))

    def _put(self, first: int, entries: list[dict[str, Any]], now: datetime) -> None:
        puts = []
        for offset, entry in enumerate(entries):
            item: dict[str, Any] = {
                "pk": _pk(self.ref.job_id, self.part),
                "sk": log_sk(first + offset),
                "job_id": self.ref.job_id,
                "seq": first + offset,
                "stage": self.stage,
                "attempt": self.ref.attempt,
                "agent_id": self.ref.agent_id,
                # A shard's lines say which shard wrote them (followed apart or interleaved).
                **({} if self.ref.shard is None else {"shard": self.ref.shard}),
                **entry,
                "written_at": now.isoformat(),
                "ttl": self.expires_at,
            }
            puts.append(
                {
                    "Put": {
                        "TableName": self.ref.table,
                        "Item": to_attributes(item),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                }
            )
        fence = {
            "ConditionCheck": {
                "TableName": self.ref.table,
                "Key": self.ref.key,
                **holds_attempt_check(self.ref),
            }
        }
        client("dynamodb").transact_write_items(TransactItems=[*puts, fence])
        self.transactions += 1
