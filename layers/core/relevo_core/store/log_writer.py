"""Access pattern: an attempt appending its output to its job's log (store/log_chunks): a large
chunk's body stored in S3 first (store/log_bodies), then the items ready written in one
transaction with the one ConditionCheck that fences them all on the attempt."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, in_this_context
from relevo_core.store import log_bodies
from relevo_core.store.codec import to_attributes
from relevo_core.store.conditional import transaction_cancellation
from relevo_core.store.keys import log_sk
from relevo_core.store.log_chunks import (
    INLINE_MAX_BYTES,
    MAX_CHUNK_BYTES,
    MAX_INLINE_CHUNK_BYTES,
    PARALLEL_BODIES,
    LogPart,
    partition_pk,
    partition_tail,
)
from relevo_core.store.stage_attempts import LeaseLost, StageRef, holds_attempt_check

# Index items written in one transaction (with its ConditionCheck): DynamoDB allows 100 items.
MAX_BATCH = 32


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
            top, self._last_at = partition_tail(self.ref.table, self.ref.job_id, self.part)
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
                top, stored_at = partition_tail(self.ref.table, self.ref.job_id, self.part)
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
                "pk": partition_pk(self.ref.job_id, self.part),
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
