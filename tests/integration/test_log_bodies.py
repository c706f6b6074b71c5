"""A fast-printing command's log on the local stack (issue 29): large chunks' bodies go to S3
under the job's prefix, their fenced index items are written several to a transaction, and the
log still reads back whole, in order and masked; a body gone or altered says so where it stood;
nothing is stored once the attempt is no longer held.

The count: DynamoDB write requests per stored chunk. Every chunk used to be a transaction of its
own (1 request per chunk, 2 write units a KB in one partition key: about 0.5 MB/s on AWS).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import pytest

from relevo_agent.logs import LogShipper, Masker
from relevo_core.aws import client
from relevo_core.models.job_objects import JobPrefix
from relevo_core.store import log_chunks, log_reads, log_writer, stage_attempts, stage_claims
from tests.helpers.stack import table_items

CANARY = "canary-" + "s" * 12


def _claimed(stack, job_id: str) -> stage_attempts.StageRef:
    ref = stage_attempts.StageRef(stack.table_name, job_id, 0, 1, "mac-logs")
    client("dynamodb").put_item(
        TableName=stack.table_name, Item={"pk": {"S": f"STAGES#{job_id}"}, "sk": {"S": "STAGE#00"}}
    )
    stage_claims.claim(ref, 60, datetime.now(UTC))
    return ref


def _read_all(stack, job_id: str) -> list[log_chunks.LogChunk]:
    """The whole log, its bodies read under the job's prefix (these jobs have no job record to say it)."""
    chunks, from_seq = [], 0
    home = JobPrefix.of(f"s3://{stack.resources['ArtifactBucket']}/p-logs/{job_id}/")
    while from_seq is not None:
        page = log_reads.read_chunks(stack.table_name, job_id, from_seq=from_seq, limit=100, home=home)
        chunks += page.chunks
        from_seq = page.next_seq
    return chunks


class _Writes:
    """DynamoDB write requests this process sends, counted as botocore sends them."""

    def __init__(self) -> None:
        self.count = 0
        self._dynamodb = client("dynamodb")

    def __enter__(self) -> _Writes:
        self._dynamodb.meta.events.register("before-call.dynamodb.*", self._seen)
        return self

    def _seen(self, model: Any, **_: Any) -> None:
        if model.name in ("PutItem", "UpdateItem", "TransactWriteItems", "BatchWriteItem"):
            self.count += 1

    def __exit__(self, *_: object) -> None:
        self._dynamodb.meta.events.unregister("before-call.dynamodb.*", self._seen)


def test_a_fast_printing_commands_log_goes_to_s3_in_few_writes_and_reads_back_whole_in_order_and_masked(
    local_stack,
):
    job_id = "job_" + secrets.token_hex(10)
    ref = _claimed(local_stack, job_id)
    bucket = local_stack.resources["ArtifactBucket"]
    writer = log_writer.ChunkWriter(ref, "build", 1_900_000_000, f"s3://{bucket}/p-logs/{job_id}/")
    lines = [
        f"line {i:08d} {'x' * 100}\n" if i % 1000 else f"line {i:08d} token={CANARY}\n"
        for i in range(1, 60_001)
    ]
    with _Writes() as writes:
        shipper = LogShipper(
            writer, Masker([CANARY]), max_chunk_bytes=writer.max_chunk_bytes, flush_interval_sec=0.05
        ).start()
        for line in lines:
            shipper.write(line.encode())
        stats = shipper.close(timeout_sec=120)
    chunks = _read_all(local_stack, job_id)
    text = "".join(chunk.data for chunk in chunks)
    assert text == "".join(lines).replace(CANARY, "******")  # every line, in order, masked
    assert [chunk.seq for chunk in chunks] == list(range(len(chunks))) == list(range(stats.chunks))
    in_s3 = [chunk for chunk in chunks if chunk.body]
    assert in_s3 and all(
        chunk.body.startswith(f"s3://{bucket}/p-logs/{job_id}/.relevo-logs/build/1/") for chunk in in_s3
    )
    assert max(chunk.byte_size for chunk in chunks) <= log_chunks.MAX_CHUNK_BYTES
    # The counts: fewer write requests than chunks (one per chunk before), and the log's partition
    # takes 2 write units (a transaction's item under 1 KB) per chunk of up to a MiB: below 3 per
    # MB stored, where inline chunks took about 2,000 (2 units a KB).
    assert writes.count < stats.chunks, (writes.count, stats.chunks)
    assert writer.transactions == writes.count
    items = table_items(local_stack, f"LOGS#{job_id}")
    units = sum(
        2 * -(-len(str(item).encode()) // 1024) for item in items
    )  # an upper bound of each item's size
    assert units / (len(text.encode()) / 2**20) < 3, units


def test_a_body_gone_or_altered_says_so_where_it_stood_and_a_fenced_writer_stores_nothing(local_stack):
    job_id = "job_" + secrets.token_hex(10)
    ref = _claimed(local_stack, job_id)
    bucket = local_stack.resources["ArtifactBucket"]
    writer = log_writer.ChunkWriter(ref, "build", 1_900_000_000, f"s3://{bucket}/p-logs/{job_id}/")
    now = datetime.now(UTC)
    big = ["a" * 40_000 + "\n", "b" * 40_000 + "\n", "c" * 40_000 + "\n"]
    assert writer.append_many(["small\n", *big], now) == [0, 1, 2, 3]
    chunks = {chunk.seq: chunk for chunk in _read_all(local_stack, job_id)}
    s3 = client("s3")
    s3.put_object(Bucket=bucket, Key=chunks[2].body.split("/", 3)[3], Body=b"tampered\n")
    s3.delete_object(Bucket=bucket, Key=chunks[3].body.split("/", 3)[3])
    shown = [chunk.data for chunk in _read_all(local_stack, job_id)]
    assert shown[:2] == ["small\n", big[0]]
    assert shown[2].startswith("[relevo] chunk 2 of this log cannot be shown:") and "sha256" in shown[2]
    assert shown[3].startswith("[relevo] chunk 3 of this log cannot be shown:") and "is gone" in shown[3]
    # Another agent takes the attempt over: the old writer's next chunks are refused, small or large.
    stage_claims.claim(stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-other"), 60, now)
    with pytest.raises(stage_attempts.LeaseLost):
        writer.append_many(["zombie\n", "z" * 40_000 + "\n"], now)
    assert log_chunks.last_seq(local_stack.table_name, job_id) == 3


def test_the_job_view_and_the_log_route_read_bodies_in_s3_as_their_functions_roles(local_stack, project_id):
    """GET /jobs/{id} (its log tail) and GET /jobs/{id}/logs read the bodies with the roles their
    functions run as, under the local stack's IAM enforcement."""
    from relevo_cli.api import RelevoApi
    from tests.helpers.stack import receive_stage
    from tests.helpers.state_machine import start_job

    job_id = start_job(local_stack, project_id, stages=[{"name": "build", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    ref = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-logs")
    stage_claims.claim(ref, 60, datetime.now(UTC))
    bucket = local_stack.resources["ArtifactBucket"]
    writer = log_writer.ChunkWriter(ref, "build", 1_900_000_000, f"s3://{bucket}/{project_id}/{job_id}/")
    body = "".join(f"printed {i}\n" for i in range(3000))
    writer.append_many([body, "the end\n"], datetime.now(UTC))
    api = RelevoApi.for_stack(local_stack)
    tail = api.get_job(job_id)["log_tail"]["lines"]
    assert [line["text"] for line in tail[-2:]] == ["printed 2999", "the end"]
    page = api.request("GET", f"/jobs/{job_id}/logs")
    assert "".join(chunk["text"] for chunk in page["chunks"]) == body + "the end\n"
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_a_body_gone_is_shown_as_gone_and_the_rest_of_the_log_served_as_the_functions_roles(
    local_stack, project_id
):
    """The functions' roles may not list the bucket but for log bodies: S3 answers a missing body
    404 to them, as a caller with s3:ListBucket, where it would answer 403 to one without (Amazon
    S3 API Reference, GetObject, "Permissions"), so one body gone never fails a whole page."""
    from relevo_cli.api import RelevoApi
    from tests.helpers.stack import receive_stage
    from tests.helpers.state_machine import start_job

    # Given a job whose log holds two bodies in S3, one of them since gone (expired, deleted)
    job_id = start_job(local_stack, project_id, stages=[{"name": "build", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    ref = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-logs")
    stage_claims.claim(ref, 60, datetime.now(UTC))
    bucket = local_stack.resources["ArtifactBucket"]
    writer = log_writer.ChunkWriter(ref, "build", 1_900_000_000, f"s3://{bucket}/{project_id}/{job_id}/")
    first, second = ("".join(f"{name} {i}\n" for i in range(3000)) for name in ("first", "second"))
    writer.append_many([first, second, "the end\n"], datetime.now(UTC))
    gone = next(chunk for chunk in _read_all(local_stack, job_id) if chunk.seq == 0)
    client("s3").delete_object(Bucket=bucket, Key=gone.body.split("/", 3)[3])

    # When the log route and the job view read it, each as its function's role
    api = RelevoApi.for_stack(local_stack)
    page = api.request("GET", f"/jobs/{job_id}/logs")
    tail = api.get_job(job_id)["log_tail"]["lines"]

    # Then the body gone is said to be gone where it stood, and every other line is served
    texts = [chunk["text"] for chunk in page["chunks"]]
    assert texts[0].startswith("[relevo] chunk 0 of this log cannot be shown:") and "is gone" in texts[0]
    assert texts[1:] == [second, "the end\n"]
    assert [line["text"] for line in tail[-2:]] == ["second 2999", "the end"]
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")
