"""Access pattern: a job's output as ordered log chunks, one item per chunk under `LOGS#{job}`.

A small chunk's text is in its item. A large one's body is an S3 object (store/log_bodies: one
partition key takes 1,000 write units a second, about 0.5 MB/s of inline text in transactions),
and its item is an index entry: the object, its sha256 and size. The items a writer has ready are
written in one transaction, with the one ConditionCheck that fences them all.

`seq` is strictly increasing per job across stages, attempts and agents. A writer starts after the
highest stored seq and allocates each seq with a conditional put (`attribute_not_exists`), so two
writers can never store the same seq; a writer that loses a race re-reads the tail and moves on.
Every put is fenced on the writer still holding its stage attempt (a ConditionCheck on the stage
item in the same transaction), so a zombie agent cannot add output after its successor took over.
Chunks expire through the table's TTL attribute at the job's `log_ttl` (its envelope: the
stack's LogRetentionDays after the job was created).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from relevo_core import job_objects
from relevo_core.aws import client, in_this_context
from relevo_core.job_objects import JobPrefix
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.store import log_bodies
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.jobs import get_envelope
from relevo_core.store.keys import key, log_pk, log_sk
from relevo_core.store.stage_attempts import LeaseLost, StageRef, holds_attempt_check
from relevo_core.store.conditional import transaction_cancellation

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


def job_home(table: str, job_id: str) -> JobPrefix | None:
    """The job's prefix (its envelope's artifact_uri), where its log bodies must be; None once
    the job record is gone."""
    try:
        return JobPrefix.of(get_envelope(table, job_id).artifact_uri)
    except RelevoError as exc:
        if exc.code is ErrorCode.JOB_NOT_FOUND:
            return None
        raise


def _with_bodies(table: str, job_id: str, chunks: list[LogChunk], home: JobPrefix | None) -> list[LogChunk]:
    """The chunks with the text of each body kept in S3 read in (side by side), each verified
    against the sha256 its item recorded; a body gone or altered reads as a line saying so. A
    body's key is its writer's choice (a uuid, not derivable): only one under the job's own
    prefix `home` is read (relevo_core.job_objects), any other reads as a line saying so."""
    stored = [chunk for chunk in chunks if chunk.body]
    if stored and home is None:
        home = job_home(table, job_id)

    def filled(chunk: LogChunk) -> LogChunk:
        if chunk.body is None or chunk.body_sha256 is None:
            return chunk
        try:
            if home is None:
                raise log_bodies.BodyMissing(f"job {job_id} is gone")
            object_key = job_objects.object_key(home, chunk.body, (log_pk(job_id), log_sk(chunk.seq)))
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
    with ThreadPoolExecutor(max_workers=min(PARALLEL_BODIES, len(stored)), thread_name_prefix="log-read") as pool:
        return list(pool.map(in_this_context(filled), chunks))


def _within_page(chunks: list[LogChunk], from_end: bool = False) -> list[LogChunk]:
    """The chunks that fit PAGE_MAX_BYTES (at least one), from the start or from the end."""
    kept: list[LogChunk] = []
    total = 0
    for chunk in reversed(chunks) if from_end else chunks:
        if kept and total + chunk.byte_size > PAGE_MAX_BYTES:
            break
        kept.append(chunk)
        total += chunk.byte_size
    return list(reversed(kept)) if from_end else kept


class LogPage(BaseModel):
    model_config = ConfigDict(frozen=True)

    chunks: list[LogChunk]
    # The seq to ask for next (`from_seq`), or None when the stored log ends here.
    next_seq: int | None


def last_seq(table: str, job_id: str) -> int:
    """The highest stored seq of the job, -1 when it has no output yet."""
    response = client("dynamodb").query(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": log_pk(job_id)}},
        ProjectionExpression="seq",
        ScanIndexForward=False,
        Limit=1,
        ConsistentRead=True,
    )
    items = response.get("Items", [])
    return int(items[0]["seq"]["N"]) if items else -1


def chunk_stored(table: str, job_id: str, seq: int) -> bool:
    """Whether chunk `seq` of the job is stored (a consistent read of its key only)."""
    response = client("dynamodb").get_item(
        TableName=table, Key=key(log_pk(job_id), log_sk(seq)), ProjectionExpression="seq", ConsistentRead=True
    )
    return "Item" in response


def read_chunks(table: str, job_id: str, from_seq: int = 0, limit: int = 100, home: JobPrefix | None = None) -> LogPage:
    """Page forward through a job's output: chunks with seq >= from_seq, at most `limit` and
    PAGE_MAX_BYTES of text, bodies kept in S3 read in. `home`: the job's prefix, when the caller
    has read its envelope already (else read from the job record when a body is to be read)."""
    response = client("dynamodb").query(
        TableName=table,
        KeyConditionExpression="pk = :pk AND sk >= :from",
        ExpressionAttributeValues={":pk": {"S": log_pk(job_id)}, ":from": {"S": log_sk(max(0, from_seq))}},
        Limit=limit,
        ConsistentRead=True,
    )
    found = [LogChunk.model_validate(from_attributes(item)) for item in response.get("Items", [])]
    chunks = _within_page(found)
    more = ("LastEvaluatedKey" in response or len(chunks) < len(found)) and chunks
    return LogPage(chunks=_with_bodies(table, job_id, chunks, home), next_seq=chunks[-1].seq + 1 if more else None)


def read_chunks_before(table: str, job_id: str, before_seq: int | None = None, limit: int = 100, home: JobPrefix | None = None) -> LogPage:
    """Page back through a job's output: the last `limit` chunks with seq < before_seq (the end
    of the log when None), in ascending order; `next_seq` is the seq to page further back from
    (`before_seq` of the next call), or None when the page reaches the start of the log."""
    condition, values = "pk = :pk", {":pk": {"S": log_pk(job_id)}}
    if before_seq is not None:
        condition += " AND sk < :before"
        values[":before"] = {"S": log_sk(max(0, before_seq))}
    response = client("dynamodb").query(
        TableName=table,
        KeyConditionExpression=condition,
        ExpressionAttributeValues=values,
        ScanIndexForward=False,
        Limit=limit,
        ConsistentRead=True,
    )
    found = [LogChunk.model_validate(from_attributes(item)) for item in reversed(response.get("Items", []))]
    chunks = _within_page(found, from_end=True)
    more = ("LastEvaluatedKey" in response or len(chunks) < len(found)) and chunks and chunks[0].seq > 0
    return LogPage(chunks=_with_bodies(table, job_id, chunks, home), next_seq=chunks[0].seq if more else None)


class ChunkWriter:
    """Appends one attempt's output to its job's log. Not thread-safe: one shipper thread owns it.
    `artifact_uri`: the job's prefix, where large chunks' bodies go (None: every chunk inline)."""

    def __init__(self, ref: StageRef, stage: str, expires_at: int, artifact_uri: str | None = None) -> None:
        self.ref = ref
        self.stage = stage
        # Epoch seconds, the chunks' TTL attribute: the job envelope's log_expires_at.
        self.expires_at = expires_at
        self.artifact_uri = artifact_uri
        self._next: int | None = None
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
            entries[index] = {"body": f"s3://{bucket}/{object_key}", "body_sha256": digest, "size": len(encoded[index])}

        if len(large) == 1:
            store(large[0])
        elif large:
            with ThreadPoolExecutor(max_workers=min(PARALLEL_BODIES, len(large)), thread_name_prefix="log-body") as pool:
                list(pool.map(in_this_context(store), large))
        self.bodies += len(large)
        return entries

    def _write(self, entries: list[dict[str, Any]], now: datetime) -> list[int]:
        if self._next is None:
            self._next = last_seq(self.ref.table, self.ref.job_id) + 1
        while True:
            first = self._next
            try:
                self._put(first, entries, now)
            except ClientError as exc:
                cancellation = transaction_cancellation(exc)
                if cancellation is None:
                    raise
                if cancellation.condition_failed(len(entries)):
                    raise LeaseLost(f"{self.ref.job_id} stage {self.ref.stage_index} attempt {self.ref.attempt}") from exc
                if not any(cancellation.condition_failed(i) for i in range(len(entries))):
                    raise
                # Another writer (an earlier attempt's last flush) took one of these seqs:
                # continue after what is stored.
                self.collisions += 1
                self._next = max(first + 1, last_seq(self.ref.table, self.ref.job_id) + 1)
                continue
            self._next = first + len(entries)
            return list(range(first, self._next))

    def _put(self, first: int, entries: list[dict[str, Any]], now: datetime) -> None:
        puts = []
        for offset, entry in enumerate(entries):
            item: dict[str, Any] = {
                "pk": log_pk(self.ref.job_id),
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
            puts.append({"Put": {"TableName": self.ref.table, "Item": to_attributes(item), "ConditionExpression": "attribute_not_exists(pk)"}})
        fence = {"ConditionCheck": {"TableName": self.ref.table, "Key": self.ref.key, **holds_attempt_check(self.ref)}}
        client("dynamodb").transact_write_items(TransactItems=[*puts, fence])
        self.transactions += 1
