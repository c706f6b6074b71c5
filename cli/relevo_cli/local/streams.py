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

import sys
import threading
from typing import Any, Callable


def record_filter(patterns: tuple[str, ...]) -> Callable[[dict[str, Any]], bool]:
    """Whether a record (as Lambda delivers it) passes the event source's filters; no filter
    passes everything."""
    from moto.events.models import EventPattern

    compiled = [EventPattern.load(pattern) for pattern in patterns]
    if not compiled:
        return lambda _record: True
    return lambda record: any(pattern.matches_event(record) for pattern in compiled)


class StreamPoller:
    def __init__(
        self,
        streams: Any,
        stream_arn: str,
        batch_size: int,
        invoke: Callable[[dict[str, Any]], Any],
        name: str,
        keep: Callable[[dict[str, Any]], bool] = lambda _record: True,
    ) -> None:
        self.keep = keep
        self.streams = streams
        self.stream_arn = stream_arn
        self.batch_size = batch_size
        self.invoke = invoke
        self.name = name
        self._iterators: dict[str, str | None] = {}
        self.delivered = 0

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
        thread = threading.Thread(target=self._run, args=(stopping, interval_sec), daemon=True, name=f"stream-{self.name}")
        thread.start()
        return thread

    def _run(self, stopping: threading.Event, interval_sec: float) -> None:
        while not stopping.wait(interval_sec):
            try:
                self._discover_shards("TRIM_HORIZON")  # shards that appear later are read whole
                self.poll_once()
            except Exception as exc:  # a broken poll must not end the stack's stream delivery
                sys.stderr.write(f"stream {self.name}: {exc}\n")

    def poll_once(self) -> int:
        delivered = 0
        for shard_id, iterator in list(self._iterators.items()):
            if iterator is None:
                continue  # a closed shard, read to its end
            page = self.streams.get_records(ShardIterator=iterator, Limit=self.batch_size)
            self._iterators[shard_id] = page.get("NextShardIterator")
            delivered_as = [_as_lambda_delivers(record, self.stream_arn) for record in page.get("Records", [])]
            records = [record for record in delivered_as if self.keep(record)]
            if not records:
                continue
            response = self.invoke({"Records": records})
            failures = (response or {}).get("batchItemFailures") if isinstance(response, dict) else None
            if failures:
                sys.stderr.write(f"stream {self.name}: {len(failures)} record(s) reported failed: {failures}\n")
            delivered += len(records)
        self.delivered += delivered
        return delivered


def _as_lambda_delivers(record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    """A stream record as Lambda's event source mapping delivers it: JSON, its `dynamodb`
    `ApproximateCreationDateTime` in epoch seconds (boto3 parses it into a datetime), and the
    stream's ARN ("Using AWS Lambda with Amazon DynamoDB", event example)."""
    change = dict(record.get("dynamodb", {}))
    created = change.get("ApproximateCreationDateTime")
    if hasattr(created, "timestamp"):
        change["ApproximateCreationDateTime"] = int(created.timestamp())
    return {**record, "dynamodb": change, "eventSourceARN": stream_arn}
