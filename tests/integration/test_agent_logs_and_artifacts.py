"""Log shipping and artifact upload by the real agent code on the local stack: relevo_agent's
Agent handles the real stage messages (claim, run, ship, upload, report) in this process."""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relevo_agent.config import AgentConfig
from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_core.aws import client
from relevo_core.store import artifacts as artifact_store
from relevo_core.store import log_chunks, log_reads, log_writer, stage_attempts, stage_claims
from relevo_core.store.codec import from_attributes
from relevo_core.store.jobs import get_envelope
from tests.helpers.agents import handle_received
from tests.helpers.payloads import push_body
from tests.helpers.stack import (
    deliver,
    job_items,
    receive_stage,
    register_project,
    table_items,
    wait_for_execution,
)
from tests.helpers.state_machine import claim_and_accept, wait_for_run_token

CANARY_VAR = "RELEVO_TEST_DEPLOY_TOKEN"
LINES = 3000

# Prints LINES numbered lines with the canary on some of them, then the canary split over two
# writes with a pause between (two reads of the pipe), then leaves two artifacts.
BUILD = (
    f'for i in $(seq 1 {LINES}); do if [ $((i % 500)) -eq 0 ]; then echo "line $i token=${CANARY_VAR}"; '
    'else echo "line $i"; fi; done; '
    f'printf "split=%s" "${{{CANARY_VAR}:0:9}}"; sleep 0.3; printf "%s\\n" "${{{CANARY_VAR}:9}}"; '
    'mkdir -p "$RELEVO_ARTIFACT_DIR/sub"; head -c 300000 /dev/urandom > "$RELEVO_ARTIFACT_DIR/app.ipa"; '
    'echo "dsym" > "$RELEVO_ARTIFACT_DIR/sub/app.dsym"'
)
# Fails transiently (EX_TEMPFAIL) on its first attempt, succeeds on the second.
DAY = 24 * 3600
SIGN = 'echo "sign attempt $RELEVO_ATTEMPT"; if [ "$RELEVO_ATTEMPT" = "1" ]; then exit 75; fi; echo signed'


def _agent(tmp_path: Path, stack, agent_id: str) -> Agent:
    config = AgentConfig(
        agent_id=agent_id,
        region="eu-west",
        capacity=1,
        workspace_root=tmp_path / agent_id,
        journal=tmp_path / f"{agent_id}.sqlite3",
        mask=(CANARY_VAR,),
        max_clock_skew_sec=0.5,  # agents of one host: their 3 s leases leave room to renew
    )
    return Agent(config, stack.table_name, stack.work_queues["eu-west"], api_url=stack.api_url)


def _run_next(stack, agent: Agent, job_id: str) -> dict:
    task, receipt = receive_stage(stack, job_id, timeout=60)
    handle_received(
        agent,
        Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )
    return task


def _all_chunks(stack, job_id: str, page: int = 7) -> list[log_chunks.LogChunk]:
    chunks, from_seq = [], 0
    while from_seq is not None:
        result = log_reads.read_chunks(stack.table_name, job_id, from_seq=from_seq, limit=page)
        chunks.extend(result.chunks)
        from_seq = result.next_seq
    return chunks


@pytest.mark.timeout(180)
def test_logs_are_ordered_masked_and_continue_across_agents_and_attempts(
    local_stack, project_id, tmp_path, monkeypatch
):
    # Given a project whose build prints a masked canary secret and leaves artifacts
    canary = "canary-" + secrets.token_hex(12)
    monkeypatch.setenv(CANARY_VAR, canary)
    secret = register_project(
        local_stack,
        project_id,
        [{"name": "build", "run": BUILD}, {"name": "sign", "run": SIGN}],
        retry={"backoff_base_sec": 0, "max_delay_sec": 0},
        # Sign's second attempt comes from its own transient exit, not a lapse: a 10 s lease was
        # fenced on a loaded host when a renewal came back late, and the build ran twice.
        lease_ttl_sec=60,
    )
    response = deliver(
        local_stack, project_id, push_body(f"acme/{project_id}", secrets.token_hex(20)), secret
    )
    job_id = response.json()["job_id"]
    mac_a, mac_b = _agent(tmp_path, local_stack, "mac-a"), _agent(tmp_path, local_stack, "mac-b")

    # When agent A runs the build and sign's first attempt, and agent B sign's second attempt
    assert _run_next(local_stack, mac_a, job_id)["stage"] == "build"
    assert (_run_next(local_stack, mac_a, job_id)["stage"], 1) == ("sign", 1)
    second = _run_next(local_stack, mac_b, job_id)
    assert (second["stage"], second["attempt"]) == ("sign", 2)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

    # Then the chunks have strictly increasing seq from 0, continuing across agents and attempts
    chunks = _all_chunks(local_stack, job_id)
    seqs = [c.seq for c in chunks]
    assert seqs == list(range(len(chunks))), seqs
    owners = [(c.stage, c.attempt, c.agent_id) for c in chunks]
    assert owners == sorted(owners, key=owners.index)  # each writer's chunks are contiguous
    assert [o for i, o in enumerate(owners) if o not in owners[:i]] == [
        ("build", 1, "mac-a"),
        ("sign", 1, "mac-a"),
        ("sign", 2, "mac-b"),
    ]
    first_of_b = next(c.seq for c in chunks if c.agent_id == "mac-b")
    assert first_of_b > 0, "the second agent continues the job's sequence"
    # and every line is there, in order, with the canary masked (also the one split in two)
    text = "".join(c.data for c in chunks)
    lines = text.splitlines()
    numbered = [line for line in lines if line.startswith("line ")]
    assert [int(line.split()[1]) for line in numbered] == list(range(1, LINES + 1))
    assert "line 500 token=******" in lines
    assert "split=******" in lines
    assert lines.index("sign attempt 1") < lines.index("sign attempt 2") < lines.index("signed")
    # and the canary is nowhere in the table: not in chunks, not in any other item
    everything = json.dumps(table_items(local_stack, ""))
    assert canary not in everything
    # and retention is the stack's (template defaults): the job 30 days from its creation, its
    # log chunks 14, its artifact records with the job; the agent took both from the envelope
    envelope = get_envelope(local_stack.table_name, job_id)
    created = int(envelope.created_at.timestamp())
    assert (envelope.ttl, envelope.log_ttl) == (created + 30 * DAY, created + 14 * DAY)
    # (the job record and its stage records alike)
    records = job_items(local_stack, job_id)
    assert sorted(i["sk"]["S"] for i in records) == ["JOB", "STAGE#00", "STAGE#01"]
    assert {int(item["ttl"]["N"]) for item in records} == {envelope.ttl}
    assert {int(item["ttl"]["N"]) for item in table_items(local_stack, f"LOGS#{job_id}")} == {
        envelope.log_ttl
    }
    assert {int(item["ttl"]["N"]) for item in table_items(local_stack, f"ARTIFACTS#{job_id}")} == {
        envelope.ttl
    }

    # and the build's artifacts are in S3 with their sha256 recorded and verifiable
    records = artifact_store.list_artifacts(local_stack.table_name, job_id, "build")
    assert sorted(r.path for r in records) == ["app.ipa", "sub/app.dsym"]
    workspace = tmp_path / "mac-a" / project_id / ".relevo-artifacts" / job_id / "build"
    for record in records:
        local = (workspace / record.path).read_bytes()
        bucket, key = record.uri.removeprefix("s3://").split("/", 1)
        stored = client("s3").get_object(Bucket=bucket, Key=key)
        assert (
            hashlib.sha256(stored["Body"].read()).hexdigest()
            == record.sha256
            == hashlib.sha256(local).hexdigest()
        )
        assert stored["Metadata"]["sha256"] == record.sha256
        assert key.endswith(f"/{job_id}/build/{record.path}")
        assert (record.size, record.attempt, record.agent_id, record.cross_region_bytes) == (
            len(local),
            1,
            "mac-a",
            0,
        )
    assert "[relevo] uploaded app.ipa" in text
    stage = job_items(local_stack, job_id)
    build = next(i for i in stage if i["sk"]["S"] == "STAGE#00")
    assert (build["artifact_count"]["N"], build["cross_region_bytes"]["N"]) == ("2", "0")


def _claimed(stack, job_id: str, agent_id: str, attempt: int = 1) -> stage_attempts.StageRef:
    ref = stage_attempts.StageRef(stack.table_name, job_id, 0, attempt, agent_id)
    client("dynamodb").put_item(
        TableName=stack.table_name,
        Item={"pk": {"S": f"STAGES#{job_id}"}, "sk": {"S": "STAGE#00"}, "stage": {"S": "build"}},
    )
    stage_claims.claim(ref, 30, datetime.now(UTC))
    return ref


def test_concurrent_writers_never_share_a_seq_and_a_fenced_writer_is_refused(local_stack):
    # Given two writers for one job whose seq counters both start from the stored tail
    job_id = "job_" + secrets.token_hex(8)
    ref = _claimed(local_stack, job_id, "mac-a")
    now = datetime.now(UTC)
    one = log_writer.ChunkWriter(ref, "build", expires_at=1_900_000_000)
    two = log_writer.ChunkWriter(ref, "build", expires_at=1_900_000_000)
    # When both append, interleaved (the second one's next seq is already taken every time)
    seqs = []
    for i in range(4):
        seqs.append(one.append(f"one {i}\n", now))
        seqs.append(two.append(f"two {i}\n", now))
    # Then every chunk got its own seq, in the order they were stored
    assert seqs == list(range(8))
    assert two.collisions >= 1
    assert [c.data for c in log_reads.read_chunks(local_stack.table_name, job_id).chunks] == [
        f"{w} {i}\n" for i in range(4) for w in ("one", "two")
    ]
    assert {item["ttl"]["N"] for item in table_items(local_stack, f"LOGS#{job_id}")} == {"1900000000"}
    # When another agent takes the attempt over, the old writer's chunks are refused
    stage_claims.claim(stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-b"), 30, now)
    with pytest.raises(stage_attempts.LeaseLost):
        one.append("zombie output\n", now)
    assert log_chunks.last_seq(local_stack.table_name, job_id) == 7


def test_cross_region_bytes_are_counted_when_the_bucket_is_elsewhere(local_stack, tmp_path):
    from relevo_agent.artifacts import upload_artifacts

    # Given an artifact bucket in another AWS region than the agent's
    bucket = "relevo-far-" + secrets.token_hex(4)
    client("s3").create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "ap-southeast-2"}
    )
    job_id = "job_" + secrets.token_hex(8)
    ref = _claimed(local_stack, job_id, "mac-a")
    (tmp_path / "out.bin").write_bytes(b"x" * 5000)
    lines: list[str] = []
    # When the stage's artifacts are uploaded
    summary = upload_artifacts(
        ref, "build", tmp_path, f"s3://{bucket}/p/{job_id}/", "us-east-1", lines.append, 1_900_000_000
    )
    # Then the bytes that crossed regions are recorded
    assert summary.cross_region_bytes == 5000
    [record] = artifact_store.list_artifacts(local_stack.table_name, job_id)
    assert (record.bucket_region, record.cross_region_bytes) == ("ap-southeast-2", 5000)
    [item] = table_items(local_stack, f"ARTIFACTS#{job_id}")
    assert item["ttl"]["N"] == "1900000000"
    assert lines[-1].startswith("[relevo] uploaded out.bin: 4.9 KiB in ")
    # and a fenced agent's record is refused
    stage_claims.claim(
        stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-b"), 30, datetime.now(UTC)
    )
    with pytest.raises(stage_attempts.LeaseLost):
        upload_artifacts(
            ref, "build", tmp_path, f"s3://{bucket}/p/{job_id}/", "us-east-1", lines.append, 1_900_000_000
        )


@pytest.mark.timeout(120)
def test_reconcile_evidence_is_masked_like_logs(local_stack, project_id, tmp_path, monkeypatch, caplog):
    # Given a stage whose effect probe prints the operation id and a masked canary secret
    canary = "canary-" + secrets.token_hex(12)
    monkeypatch.setenv(CANARY_VAR, canary)
    probe = f'echo "uploaded for $RELEVO_OPERATION_ID token=${CANARY_VAR}"'
    secret = register_project(
        local_stack,
        project_id,
        [{"name": "upload", "run": "echo never run again", "effect_probe": probe}],
        # The live agent's lease (attempt 2): at 3 s, a loaded CI host's renewals came back late
        # and the keeper fenced the reconciling attempt. Attempt 1 lapses after it too.
        lease_ttl_sec=10,
        retry={"backoff_base_sec": 0, "max_delay_sec": 0},
    )
    job_id = deliver(
        local_stack, project_id, push_body(f"acme/{project_id}", secrets.token_hex(20)), secret
    ).json()["job_id"]
    # and a first attempt whose agent vanished mid-stage (claimed, then silent: the lease expires)
    first, _ = receive_stage(local_stack, job_id)
    wait_for_run_token(claim_and_accept(local_stack, first, "mac-gone", lease_ttl_sec=3))

    # When another agent takes the retry, it reconciles before running anything
    caplog.set_level("INFO", logger="relevo_agent")
    second = _run_next(local_stack, _agent(tmp_path, local_stack, "mac-b"), job_id)
    assert (second["attempt"], second["avoid_agents"]) == (2, ["mac-gone"])
    assert wait_for_execution(local_stack, job_id, timeout=60)["status"] == "SUCCEEDED"

    # Then the probe's output is recorded as evidence and receipt with the canary masked...
    stage = from_attributes(next(i for i in job_items(local_stack, job_id) if i["sk"]["S"] == "STAGE#00"))
    shown = f"uploaded for {job_id}:upload token=******\n"
    assert (stage["reconciled"]["decision"], stage["reconciled"]["evidence"]["probe_output"]) == (
        "succeeded",
        shown,
    )
    assert stage["receipt"]["probe_output"] == shown
    # ...and the canary is nowhere: not in the table, not in the agent's own log
    assert canary not in json.dumps(table_items(local_stack, ""))
    assert f"{job_id}:upload attempt 2 reconciled: succeeded" in caplog.text and canary not in caplog.text
