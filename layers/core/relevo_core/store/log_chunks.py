"""Access pattern: a job's output as ordered log chunks, one item per chunk under its log
partition: `LOGS#{job}` for the stages without shards, `LOGS#{job}/{stage}/{shard}` for each shard
of a stage with shards (keys.log_partition: one partition takes 1,000 write units a second, and
shards writing side by side would share it and its seq).

A small chunk's text is in its item. A large one's body is an S3 object (store/log_bodies: one
partition key takes 1,000 write units a second, about 0.5 MB/s of inline text in transactions),
and its item is an index entry: the object, its sha256 and size. A writer appends them
(store/log_writer); readers page through a job's partitions merged by time (store/log_reads).

`seq` is strictly increasing per partition across attempts and agents. A writer starts after the
highest stored seq and allocates each seq with a conditional put (`attribute_not_exists`), so two
writers can never store the same seq; a writer that loses a race (an earlier attempt's last flush)
re-reads the tail and moves on. Every put is fenced on the writer still holding its stage attempt
(a ConditionCheck on the stage's or the shard's record in the same transaction), so a zombie agent
cannot add output after its successor took over. A partition's `written_at` never goes back (a
writer stamps at least the time of the partition's last chunk), so the job's partitions merge by
time into one order that keeps each partition's own (log_reads.read_forward, read_backward). Chunks
expire through the table's TTL attribute at the job's `log_ttl` (its envelope: the stack's
LogRetentionDays after the job was created).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from relevo_core.aws import client
from relevo_core.store.keys import key, log_pk, log_sk

if TYPE_CHECKING:
    from relevo_core.models.envelope import JobEnvelope

# A log partition of a job: None for its own (stages without shards), (stage index, shard) for a shard's.
LogPart = tuple[int, int] | None

# DynamoDB items are at most 400 KB: a chunk's text (UTF-8) kept in its item stays below with room
# for the rest. A writer without an artifact prefix (no S3 for bodies) keeps every chunk inline.
MAX_INLINE_CHUNK_BYTES = 300 * 1024
# A chunk up to this size is kept in its item (its writes, 2 units a KB, stay cheap at the rates
# a person reads); a larger one's body goes to S3.
INLINE_MAX_BYTES = 16 * 1024
# A body in S3, at most: readers return about this much of a log a page (log_reads.PAGE_MAX_BYTES).
MAX_CHUNK_BYTES = 1024 * 1024
# Bodies uploaded (or read) side by side.
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


def job_log_parts(envelope: JobEnvelope) -> list[LogPart]:
    """The job's log partitions, from its frozen plan (never a scan): its own, then each shard's of
    each stage with shards, in plan order (the order that breaks ties of time when merging)."""
    return [None] + [
        (index, shard)
        for index, stage in enumerate(envelope.stages)
        if stage.sharded
        for shard in range(stage.shard_count)
    ]


def partition_pk(job_id: str, part: LogPart) -> str:
    return log_pk(job_id) if part is None else log_pk(job_id, *part)


def partition_tail(table: str, job_id: str, part: LogPart = None) -> tuple[int, datetime | None]:
    """(highest stored seq, its written_at) of the partition; (-1, None) when it has no output yet."""
    response = client("dynamodb").query(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": partition_pk(job_id, part)}},
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
    return partition_tail(table, job_id, part)[0]


def chunk_stored(table: str, job_id: str, seq: int, part: LogPart = None) -> bool:
    """Whether chunk `seq` of the partition is stored (a consistent read of its key only)."""
    response = client("dynamodb").get_item(
        TableName=table,
        Key=key(partition_pk(job_id, part), log_sk(seq)),
        ProjectionExpression="seq",
        ConsistentRead=True,
    )
    return "Item" in response
