"""The local stack reads a table's stream once for all the functions it feeds
(relevo_local.streams): each page goes to every event source, through each one's own
filters and batch size, and a function that hangs delays only its own deliveries, as one event
source mapping never waits for another on AWS. Read from the session stack's own table stream."""

from __future__ import annotations

import secrets
import threading
from typing import Any

from relevo_core.aws import client
from relevo_local.streams import StreamConsumer, StreamPoller


def _reader(local_stack, first: StreamConsumer) -> StreamPoller:
    arn = client("dynamodb").describe_table(TableName=local_stack.table_name)["Table"]["LatestStreamArn"]
    return StreamPoller.reading_for(client("dynamodbstreams"), arn, first)


def _put(local_stack, pk: str) -> None:
    client("dynamodb").put_item(TableName=local_stack.table_name, Item={"pk": {"S": pk}, "sk": {"S": "T"}})


def _keys(event: dict[str, Any], tag: str) -> list[str]:
    return [
        r["dynamodb"]["Keys"]["pk"]["S"] for r in event["Records"] if tag in r["dynamodb"]["Keys"]["pk"]["S"]
    ]


def test_one_read_serves_every_consumer_with_its_own_filter_and_batch_size(local_stack):
    tag = secrets.token_hex(4)
    every: list[list[str]] = []
    jobs_only: list[list[str]] = []
    poller = _reader(local_stack, StreamConsumer("all", 100, lambda e: every.append(_keys(e, tag))))
    poller.add_consumer(
        StreamConsumer(
            "jobs",
            2,
            lambda e: jobs_only.append(_keys(e, tag)),
            keep=lambda record: record["dynamodb"]["Keys"]["pk"]["S"].startswith(f"T#{tag}#JOB"),
        )
    )
    poller._discover_shards("LATEST")
    for n in range(5):
        _put(local_stack, f"T#{tag}#JOB{n}")
    _put(local_stack, f"T#{tag}#LOGS")

    read = poller.poll_once()
    assert read >= 6  # the session stack's own writes may be on the stream too
    assert [k for batch in every for k in batch] == [f"T#{tag}#JOB{n}" for n in range(5)] + [f"T#{tag}#LOGS"]
    assert [batch for batch in jobs_only if batch] == [
        [f"T#{tag}#JOB0", f"T#{tag}#JOB1"],
        [f"T#{tag}#JOB2", f"T#{tag}#JOB3"],
        [f"T#{tag}#JOB4"],
    ]


def test_a_hung_consumer_delays_only_its_own_deliveries(local_stack):
    tag = secrets.token_hex(4)
    release, stopping, both = threading.Event(), threading.Event(), threading.Event()
    fast_got: list[str] = []

    def fast(event: dict[str, Any]) -> None:
        fast_got.extend(_keys(event, tag))
        if len(fast_got) == 2:
            both.set()

    poller = _reader(local_stack, StreamConsumer("hung", 100, lambda _e: release.wait(60)))
    poller.add_consumer(StreamConsumer("fast", 100, fast))
    try:
        poller.start(stopping, interval_sec=0.1)
        _put(local_stack, f"T#{tag}#1")
        _put(local_stack, f"T#{tag}#2")
        assert both.wait(30), fast_got  # while "hung" still holds the first page
        assert fast_got == [f"T#{tag}#1", f"T#{tag}#2"]
    finally:
        release.set()
        stopping.set()
