"""Queue control on the embedded stack: GET /queue (jobs in run order, the fleet's agents), promote
and priority of queued jobs (they move in their project's waiting order, so the promoted job runs
next), and DELETE of ended jobs with their logs and artifact records, safe to repeat."""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.main import app
from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store import agents, artifacts, audit, log_chunks, stage_attempts, wait_order
from relevo_core.store.codec import from_attributes
from relevo_core.store.job_purge import delete_partition
from relevo_core.store.keys import log_pk
from relevo_local.identity import local_user_arn
from tests.helpers import TEST_ADMIN_ARN
from tests.helpers.iam import iam_user
from tests.helpers.stack import receive_stage, register_project, table_items, wait_for_execution, wait_until
from tests.helpers.state_machine import agent_runs, claim_and_accept, wait_for_run_token
from tests.integration.test_wait_order import _held_project_with_waiters, _job, _next_dispatched

runner = CliRunner()
CHUNKS = 60  # more than two BatchWriteItem batches of 25


def _refusal(call) -> tuple[int, str]:
    with pytest.raises(ApiError) as refused:
        call()
    return refused.value.status, refused.value.code


def _queued_priorities(stack) -> list[int]:
    """Every queued job's priority, of every project (a scan: tests only)."""
    records = [from_attributes(item) for item in table_items(stack, "JOB#") if item["sk"]["S"] == "JOB"]
    return [int(record["priority"]) for record in records if record["status"] == "queued"]


def _cancel_all(api, job_ids) -> None:
    for job_id in job_ids:
        try:
            api.cancel_job(job_id)
        except ApiError as exc:
            assert exc.code == "JOB_ALREADY_ENDED", exc


def test_the_queue_shows_queued_jobs_in_run_order_and_each_agents_load(
    local_stack, intake_settings, project_id, api, stack_file
):
    holder_task, (low, high, also_low) = _held_project_with_waiters(
        local_stack, intake_settings, project_id, [1, 5, 1]
    )
    now = datetime.now(UTC)
    suffix = secrets.token_hex(3)
    presence = dict(capacity=2, version="1.4.0", interval_sec=30)
    agents.put_presence(
        local_stack.table_name,
        agents.AgentPresence(
            agent_id=f"mac-up-{suffix}", region="eu-west", running=1, last_seen=now, **presence
        ),
    )
    agents.put_presence(
        local_stack.table_name,
        agents.AgentPresence(
            agent_id=f"mac-gone-{suffix}",
            region="us-east",
            running=0,
            last_seen=now - timedelta(hours=1),
            **presence,
        ),
    )
    # A region outside the stack's RegionAffinities is not part of the fleet.
    agents.put_presence(
        local_stack.table_name,
        agents.AgentPresence(
            agent_id=f"mac-odd-{suffix}", region="odd", running=0, last_seen=now, **presence
        ),
    )
    stranger, viewer = iam_user(local_stack, f"q-none-{suffix}"), iam_user(local_stack, f"q-view-{suffix}")
    api.grant(project_id, viewer.arn, "view")
    try:
        view = api.queue()
        mine = [job for job in view["jobs"] if job["project"] == project_id]
        assert view["count"] == len(view["jobs"])
        assert [job["job_id"] for job in mine] == [high, low, also_low]
        positions = [job["queue_position"] for job in mine]
        assert positions == sorted(positions) and len(set(positions)) == 3
        assert [job["queue_position"] for job in view["jobs"]] == list(range(1, view["count"] + 1))
        assert {job["queue_reason"] for job in mine} == {"project_running"}
        rows = {row["agent_id"]: row for row in view["agents"]}
        assert rows[f"mac-up-{suffix}"] == {
            "agent_id": f"mac-up-{suffix}",
            "region": "eu-west",
            "used": 1,
            "capacity": 2,
            "version": "1.4.0",
            "last_seen": now.isoformat(),
            "online": True,
            "running_stages": [],
            "paused": None,
            "not_claiming": None,
            "capabilities": None,
        }
        assert (
            rows[f"mac-gone-{suffix}"]["online"] is False
            and rows[f"mac-gone-{suffix}"]["region"] == "us-east"
        )
        assert f"mac-odd-{suffix}" not in rows

        # Filtered by view permission: counts equal rows, and only viewable projects' jobs are rows.
        hidden, shown = stranger.api.queue(), viewer.api.queue()
        assert hidden["count"] == len(hidden["jobs"]) and project_id not in {
            job["project"] for job in hidden["jobs"]
        }
        assert shown["count"] == len(shown["jobs"]) and [
            j["job_id"] for j in shown["jobs"] if j["project"] == project_id
        ] == [high, low, also_low]
        assert [job["queue_position"] for job in shown["jobs"]] == list(range(1, shown["count"] + 1))

        table = runner.invoke(app, ["queue", "--stack-file", stack_file])
        as_json = runner.invoke(app, ["queue", "--json", "--stack-file", stack_file])
        assert table.exit_code == 0 and "queued job(s)" in table.output and "agent(s)" in table.output, (
            table.output
        )
        assert as_json.exit_code == 0 and [
            j["job_id"] for j in json.loads(as_json.output)["jobs"] if j["project"] == project_id
        ] == [high, low, also_low]
    finally:
        _cancel_all(api, [holder_task["job_id"], low, high, also_low])


def test_promote_puts_a_waiting_job_first_so_it_runs_next(local_stack, intake_settings, project_id, api):
    holder_task, (first, second, last) = _held_project_with_waiters(
        local_stack, intake_settings, project_id, [5, 5, 0]
    )
    assert wait_order.waiting_jobs(local_stack.table_name, project_id) == [first, second, last]
    highest = max(_queued_priorities(local_stack))

    promoted = api.promote_job(last)

    assert promoted == {"job_id": last, "priority": highest + 1, "previous_priority": 0}
    assert wait_order.waiting_jobs(local_stack.table_name, project_id) == [last, first, second]
    assert _job(local_stack, last)["priority"] == highest + 1
    assert [job["job_id"] for job in api.queue()["jobs"]][0] == last
    trail = [entry for entry in audit.actions(local_stack.table_name, last) if entry["action"] == "promote"]
    assert len(trail) == 1 and trail[0]["actor"] == local_user_arn() and trail[0]["priority"] == highest + 1

    agent_runs(local_stack, holder_task)
    ran = []
    for _ in range(3):
        task = _next_dispatched(local_stack, {first, second, last} - set(ran))
        ran.append(task["job_id"])
        agent_runs(local_stack, task)
        assert wait_for_execution(local_stack, task["job_id"], timeout=30)["status"] == "SUCCEEDED"
    assert ran == [last, first, second]


def test_priority_moves_a_queued_job_and_is_refused_for_a_job_not_queued(
    local_stack, intake_settings, project_id, api, stack_file
):
    holder_task, (first, second) = _held_project_with_waiters(
        local_stack, intake_settings, project_id, [5, 5]
    )
    holder = holder_task["job_id"]
    try:
        changed = runner.invoke(app, ["job", "priority", second, "9", "--stack-file", stack_file])
        assert changed.exit_code == 0 and "5 -> 9" in changed.output, changed.output
        assert wait_order.waiting_jobs(local_stack.table_name, project_id) == [second, first]
        lowered = api.set_priority(second, -3)
        assert lowered == {"job_id": second, "priority": -3, "previous_priority": 9}
        assert wait_order.waiting_jobs(local_stack.table_name, project_id) == [first, second]
        assert [e["action"] for e in audit.actions(local_stack.table_name, second)].count("priority") == 2

        # The holder has left the queue (it holds the project): neither call applies to it.
        before = _job(local_stack, holder)
        assert _refusal(lambda: api.set_priority(holder, 50)) == (409, "JOB_NOT_QUEUED")
        assert _refusal(lambda: api.promote_job(holder)) == (409, "JOB_NOT_QUEUED")
        refused = runner.invoke(app, ["promote", holder, "--stack-file", stack_file])
        assert refused.exit_code == 1 and "409 JOB_NOT_QUEUED" in refused.output, refused.output
        assert _refusal(lambda: api.set_priority(first, 2_000_000)) == (422, "VALIDATION_FAILED")
        assert _refusal(lambda: api.request("POST", f"/jobs/{first}/priority", {})) == (
            422,
            "VALIDATION_FAILED",
        )
        assert _job(local_stack, holder) == before

        # A running job cannot be deleted; it is left as it was.
        assert _refusal(lambda: api.delete_job(holder)) == (409, "JOB_NOT_ENDED")
        denied = runner.invoke(app, ["job", "delete", holder, "--yes", "--stack-file", stack_file])
        assert denied.exit_code == 1 and "409 JOB_NOT_ENDED" in denied.output, denied.output
        assert _job(local_stack, holder) == before
    finally:
        _cancel_all(api, [holder, first, second])
    # Ended (canceled), it is no longer queued either.
    assert _refusal(lambda: api.promote_job(first)) == (409, "JOB_NOT_QUEUED")


def _finished_job_with_output(stack, project_id: str, api: RelevoApi) -> str:
    """A job whose one stage wrote CHUNKS log chunks and two artifact records, then succeeded."""
    register_project(stack, project_id, [{"name": "build", "run": "true"}])
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(stack, job_id)
    ref = claim_and_accept(stack, task, "mac-1")
    run_token = wait_for_run_token(ref)
    now = datetime.now(UTC)
    expires_at = int(now.timestamp()) + 86400
    writer = log_chunks.ChunkWriter(ref, "build", expires_at)
    for line in range(CHUNKS):
        writer.append(f"line {line}\n", now)
    for path in ("app.ipa", "sub/app.dsym"):
        artifacts.record(
            ref,
            artifacts.ArtifactRecord(
                job_id=job_id,
                stage="build",
                path=path,
                uri=f"s3://bucket/{job_id}/{path}",
                size=4,
                sha256=hashlib.sha256(path.encode()).hexdigest(),
                bucket_region="eu-west",
                cross_region_bytes=0,
                attempt=ref.attempt,
                agent_id="mac-1",
                uploaded_at=now.isoformat(),
            ),
            expires_at,
        )
    stage_attempts.finish(ref, StageStatus.SUCCEEDED, now, 0, None)
    client("stepfunctions").send_task_success(taskToken=run_token, output=json.dumps({"agent_id": "mac-1"}))
    assert wait_for_execution(stack, job_id, timeout=30)["status"] == "SUCCEEDED"
    wait_until(lambda: api.get_job(job_id)["status"] == "succeeded", 10, "job record succeeded")
    assert len(table_items(stack, f"LOGS#{job_id}")) == CHUNKS
    assert len(table_items(stack, f"ARTIFACTS#{job_id}")) == 2
    return job_id


def test_delete_removes_an_ended_job_with_its_logs_and_artifact_records(
    local_stack, project_id, api, stack_file
):
    job_id = _finished_job_with_output(local_stack, project_id, api)

    deleted = runner.invoke(app, ["job", "delete", job_id, "--yes", "--stack-file", stack_file])

    assert deleted.exit_code == 0, deleted.output
    assert f"with 1 stage record(s), {CHUNKS} log chunk(s) and 2 artifact record(s)" in " ".join(
        deleted.output.split()
    )
    for prefix in ("JOB#", "STAGES#", "LOGS#", "ARTIFACTS#", "TOKENS#"):
        assert table_items(local_stack, f"{prefix}{job_id}") == [], prefix
    trail = audit.actions(local_stack.table_name, job_id)
    assert [(e["action"], e["status"]) for e in trail if e["action"] == "delete"] == [("delete", "succeeded")]
    assert all(job["job_id"] != job_id for job in api.list_jobs(project=project_id)["jobs"])
    # Gone: the creator can no longer tell it from a job it may not view; an admin learns it is missing.
    assert _refusal(lambda: api.delete_job(job_id)) == (403, "FORBIDDEN")
    admin = iam_user(local_stack, TEST_ADMIN_ARN.rsplit("/", 1)[1])
    assert _refusal(lambda: admin.api.delete_job(job_id)) == (404, "JOB_NOT_FOUND")


def test_an_interrupted_delete_leaves_the_job_ended_and_the_next_delete_finishes_it(
    local_stack, project_id, api
):
    job_id = _finished_job_with_output(local_stack, project_id, api)
    # A DELETE that died part-way: its stage record and first batch of log chunks went, nothing else.
    assert delete_partition(local_stack.table_name, f"STAGES#{job_id}") == 1
    for item in sorted(table_items(local_stack, log_pk(job_id)), key=lambda item: item["sk"]["S"])[:25]:
        client("dynamodb").delete_item(
            TableName=local_stack.table_name, Key={"pk": item["pk"], "sk": item["sk"]}
        )
    assert api.get_job(job_id)["status"] == "succeeded"

    finished = api.delete_job(job_id)

    assert finished == {
        "job_id": job_id,
        "deleted": True,
        "status": "succeeded",
        "removed": {"stages": 0, "log_chunks": CHUNKS - 25, "artifacts": 2, "task_tokens": 1},
    }
    for prefix in ("JOB#", "STAGES#", "LOGS#", "ARTIFACTS#", "TOKENS#"):
        assert table_items(local_stack, f"{prefix}{job_id}") == [], prefix
    # Deleting what is already gone is harmless: the purge itself is safe to repeat.
    assert delete_partition(local_stack.table_name, log_pk(job_id)) == 0
