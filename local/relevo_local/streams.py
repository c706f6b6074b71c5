"""DynamoDB stream event sources for the local stack.

The emulator records a table's stream but has no Lambda to hand it to, so a poller reads each
shard from where it was when the stack came up (StartingPosition LATEST) and invokes the
function with the event AWS's event source mapping would send. The event source's
FilterCriteria are applied as Lambda applies them ("Lambda event filtering": a record is sent
when it matches any one filter, and a batch with none left is not sent), with moto's EventBridge
pattern matcher, which reads the same pattern syntax. What the local poller does not do, and the
function must not rely on: redelivery of reported batch item failures (logged).
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any


def record_filter(patterns: tuple[str, ...]) -> Callable[[dict[str, Any]], bool]:
    """Whether a record (as Lambda delivers it) passes the event source's filters; no filter
    passes everything."""
    from moto.events.models import EventPattern

    compiled = [EventPattern.load(pattern) for pattern in patterns]
    if not compiled:
        return lambda _record: True
    return lambda record: any(
        pattern.matches_event(record)  # type: ignore[arg-type]  # it reads any JSON document
        for pattern in compiled
    )


DISCOVER_EVERY_POLLS = 20
# Lambda functions that may read one DynamoDB stream at once (see StreamPoller.add_consumer).
MAX_READERS_PER_STREAM = 2


class TooManyStreamReaders(ValueError):
    """A template gives one table stream more Lambda readers than AWS serves without throttling."""


class StreamConsumer:
    """One function's event source on a stream: its filters, its batch size, and, when its poller
    runs, a thread of its own, so a slow or hung function delays only its own deliveries, as one
    event source mapping does not wait for another on AWS."""

    def __init__(
        self,
        name: str,
        batch_size: int,
        invoke: Callable[[dict[str, Any]], Any],
        keep: Callable[[dict[str, Any]], bool] = lambda _record: True,
    ) -> None:
        self.name = name
        self.batch_size = batch_size
        self.invoke = invoke
        self.keep = keep
        self.delivered = 0
        self._pending: queue.Queue[list[dict[str, Any]]] = queue.Queue()

    def deliver(self, records: list[dict[str, Any]]) -> int:
        """Invoke the function with the records its filters keep, at most batch_size a batch."""
        kept = [record for record in records if self.keep(record)]
        for first in range(0, len(kept), self.batch_size):
            response = self.invoke({"Records": kept[first : first + self.batch_size]})
            failures = (response or {}).get("batchItemFailures") if isinstance(response, dict) else None
            if failures:
                sys.stderr.write(
                    f"stream {self.name}: {len(failures)} record(s) reported failed: {failures}\n"
                )
        self.delivered += len(kept)
        return len(kept)

    def start(self, stopping: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self._run, args=(stopping,), daemon=True, name=f"stream-{self.name}")
        thread.start()
        return thread

    def _run(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                records = self._pending.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.deliver(records)
            except Exception as exc:  # a failed invocation must not end the stack's stream delivery
                sys.stderr.write(f"stream {self.name}: {exc}\n")


class StreamPoller:
    """Reads a stream's shards once for every consumer of it: each GetRecords page goes to each
    consumer. One reader per stream, not per function, because the calls themselves, through
    the emulator's HTTP front and the SDK, were a steady share of an idle local stack's CPU."""

    def __init__(
        self,
        streams: Any,
        stream_arn: str,
        batch_size: int,
        invoke: Callable[[dict[str, Any]], Any],
        name: str,
        keep: Callable[[dict[str, Any]], bool] = lambda _record: True,
    ) -> None:
        self.streams = streams
        self.stream_arn = stream_arn
        self.name = name
        self.consumers = [StreamConsumer(name, batch_size, invoke, keep)]
        self._iterators: dict[str, str | None] = {}
        self._threaded = False

    @classmethod
    def reading_for(cls, streams: Any, stream_arn: str, consumer: StreamConsumer) -> StreamPoller:
        poller = cls(streams, stream_arn, consumer.batch_size, consumer.invoke, consumer.name, consumer.keep)
        poller.consumers = [consumer]
        return poller

    def add_consumer(self, consumer: StreamConsumer) -> None:
        """Another event source on the same stream, before start(). AWS lets two functions read a
        stream's shards at once and throttles a third (LimitExceededException from GetRecords;
        "Concurrent shard reads in DynamoDB Streams", Lambda Developer Guide): the local stack
        refuses the template that asks for one, where AWS would accept it and then throttle."""
        if len(self.consumers) >= MAX_READERS_PER_STREAM:
            raise TooManyStreamReaders(
                f"{self.stream_arn}: {consumer.name} would be its reader number {len(self.consumers) + 1} "
                f"(after {', '.join(c.name for c in self.consumers)}); AWS throttles more than "
                f"{MAX_READERS_PER_STREAM} Lambda readers of a DynamoDB stream"
            )
        self.consumers.append(consumer)

    @property
    def delivered(self) -> int:
        return sum(consumer.delivered for consumer in self.consumers)

    def _discover_shards(self, position: str) -> None:
        description = self.streams.describe_stream(StreamArn=self.stream_arn)["StreamDescription"]
        for shard in description.get("Shards", []):
            shard_id = shard["ShardId"]
            if shard_id not in self._iterators:
                self._iterators[shard_id] = self.streams.get_shard_iterator(
                    StreamArn=self.stream_arn, ShardId=shard_id, ShardIteratorType=position
                )["ShardIterator"]

    def start(self, stopping: threading.Event, interval_sec: float = 0.5) -> threading.Thread:
        self._discover_shards("LATEST")  # before returning: nothing written after start is missed
        self._threaded = True
        for consumer in self.consumers:
            consumer.start(stopping)
        thread = threading.Thread(
            target=self._run, args=(stopping, interval_sec), daemon=True, name=f"stream-read-{self.name}"
        )
        thread.start()
        return thread

    def _run(self, stopping: threading.Event, interval_sec: float) -> None:
        polls = 0
        while not stopping.wait(interval_sec):
            try:
                # Shards that appear later are read whole. They are looked for every
                # DISCOVER_EVERY_POLLS polls, not every poll: DescribeStream on every poll was a
                # steady share of an idle local stack's CPU, and a table's stream in the emulator
                # keeps its one shard for the stack's life.
                if polls % DISCOVER_EVERY_POLLS == 0:
                    self._discover_shards("TRIM_HORIZON")
                polls += 1
                self.poll_once()
            except Exception as exc:  # a broken poll must not end the stack's stream delivery
                sys.stderr.write(f"stream {self.name}: {exc}\n")

    def poll_once(self) -> int:
        """Read each shard's next page and hand it to every consumer: queued to each consumer's
        thread once started, delivered here otherwise. Returns the records read."""
        read = 0
        limit = max(consumer.batch_size for consumer in self.consumers)
        for shard_id, iterator in list(self._iterators.items()):
            if iterator is None:
                continue  # a closed shard, read to its end
            page = self.streams.get_records(ShardIterator=iterator, Limit=limit)
            self._iterators[shard_id] = page.get("NextShardIterator")
            records = [_as_lambda_delivers(record, self.stream_arn) for record in page.get("Records", [])]
            if not records:
                continue
            read += len(records)
            for consumer in self.consumers:
                if self._threaded:
                    consumer._pending.put(records)
                else:
                    consumer.deliver(records)
        return read


def _as_lambda_delivers(record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    """A stream record as Lambda's event source mapping delivers it: JSON, its `dynamodb`
    `ApproximateCreationDateTime` in epoch seconds (boto3 parses it into a datetime), and the
    stream's ARN ("Using AWS Lambda with Amazon DynamoDB", event example)."""
    change = dict(record.get("dynamodb", {}))
    created = change.get("ApproximateCreationDateTime")
    if isinstance(created, datetime):
        change["ApproximateCreationDateTime"] = int(created.timestamp())
    return {**record, "dynamodb": change, "eventSourceARN": stream_arn}
