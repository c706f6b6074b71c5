"""Access pattern: a job's output as ordered log chunks, one item per chunk under `LOGS#{job}`.

`seq` is strictly increasing per job across stages, attempts and agents. A writer starts after the
highest stored seq and allocates each seq with a conditional put (`attribute_not_exists`), so two
writers can never store the same seq; a writer that loses a race re-reads the tail and moves on.
Every put is fenced on the writer still holding its stage attempt (a ConditionCheck on the stage
item in the same transaction), so a zombie agent cannot add output after its successor took over.
Chunks expire through the table's TTL attribute at the job's `log_ttl` (its envelope: the
stack's LogRetentionDays after the job was created).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes, to_attributes
from relevo_core.store.keys import key, log_pk, log_sk
from relevo_core.store.stage_attempts import LeaseLost, StageRef, holds_attempt_check
from relevo_core.store.conditional import transaction_cancellation

# DynamoDB items are at most 400 KB: a chunk's text (UTF-8) stays below with room for the rest.
MAX_CHUNK_BYTES = 300 * 1024


class LogChunk(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str
    seq: int = Field(ge=0)
    stage: str
    attempt: int
    agent_id: str
    data: str
    written_at: str


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


def read_chunks(table: str, job_id: str, from_seq: int = 0, limit: int = 100) -> LogPage:
    """Page forward through a job's output: chunks with seq >= from_seq, at most `limit`."""
    response = client("dynamodb").query(
        TableName=table,
        KeyConditionExpression="pk = :pk AND sk >= :from",
        ExpressionAttributeValues={":pk": {"S": log_pk(job_id)}, ":from": {"S": log_sk(max(0, from_seq))}},
        Limit=limit,
        ConsistentRead=True,
    )
    chunks = [LogChunk.model_validate(from_attributes(item)) for item in response.get("Items", [])]
    more = "LastEvaluatedKey" in response and chunks
    return LogPage(chunks=chunks, next_seq=chunks[-1].seq + 1 if more else None)


def read_chunks_before(table: str, job_id: str, before_seq: int | None = None, limit: int = 100) -> LogPage:
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
    chunks = [LogChunk.model_validate(from_attributes(item)) for item in reversed(response.get("Items", []))]
    more = "LastEvaluatedKey" in response and chunks and chunks[0].seq > 0
    return LogPage(chunks=chunks, next_seq=chunks[0].seq if more else None)


class ChunkWriter:
    """Appends one attempt's output to its job's log. Not thread-safe: one shipper thread owns it."""

    def __init__(self, ref: StageRef, stage: str, expires_at: int) -> None:
        self.ref = ref
        self.stage = stage
        # Epoch seconds, the chunks' TTL attribute: the job envelope's log_expires_at.
        self.expires_at = expires_at
        self._next: int | None = None
        self.collisions = 0

    def append(self, data: str, now: datetime) -> int:
        """Store one chunk; returns its seq. Raises LeaseLost when the attempt is no longer held."""
        if self._next is None:
            self._next = last_seq(self.ref.table, self.ref.job_id) + 1
        while True:
            seq = self._next
            try:
                self._put(seq, data, now)
            except ClientError as exc:
                cancellation = transaction_cancellation(exc)
                if cancellation is None:
                    raise
                if cancellation.condition_failed(1):
                    raise LeaseLost(f"{self.ref.job_id} stage {self.ref.stage_index} attempt {self.ref.attempt}") from exc
                if not cancellation.condition_failed(0):
                    raise
                # Another writer (an earlier attempt's last flush) took this seq: continue after it.
                self.collisions += 1
                self._next = max(seq + 1, last_seq(self.ref.table, self.ref.job_id) + 1)
                continue
            self._next = seq + 1
            return seq

    def _put(self, seq: int, data: str, now: datetime) -> None:
        item: dict[str, Any] = {
            "pk": log_pk(self.ref.job_id),
            "sk": log_sk(seq),
            "job_id": self.ref.job_id,
            "seq": seq,
            "stage": self.stage,
            "attempt": self.ref.attempt,
            "agent_id": self.ref.agent_id,
            "data": data,
            "written_at": now.isoformat(),
            "ttl": self.expires_at,
        }
        client("dynamodb").transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": self.ref.table,
                        "Item": to_attributes(item),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {
                    "ConditionCheck": {
                        "TableName": self.ref.table,
                        "Key": self.ref.key,
                        **holds_attempt_check(self.ref),
                    }
                },
            ]
        )
