"""An agent holding job X's real session (a session of JobRole minted by the claim route, under the
local stack's IAM enforcement) may put any item in X's agent-written partitions, with any
attributes. It writes locations that point at project Q's objects: an artifact record's `uri`, a
log chunk's body, a stage receipt's handoff manifest. Whoever acts on one with a function's role
(which reaches the whole bucket) refuses it, LOCATION_OUTSIDE_JOB (relevo_core.models.job_objects): the
download route gives no link, the quota's remover deletes nothing of Q and still removes X's own,
the log shows no byte of Q's, a rerun is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from relevo_agent.artifacts import upload_artifacts
from relevo_agent.claim import new_claim_secret
from relevo_agent.claim_routes import ClaimRoutes
from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.follow import LogFollower
from relevo_core.aws import client
from relevo_core.models.agent_session import ClaimRequest, JobSession
from relevo_core.store import artifact_usage, log_chunks, log_reads, stage_attempts
from relevo_core.store import artifacts as artifact_store
from relevo_core.store.jobs import get_envelope
from relevo_core.store.keys import log_pk, log_sk
from tests.helpers.iam import client_as
from tests.helpers.stack import receive_stage, wait_until
from tests.helpers.state_machine import start_job

SECRET = b"Q's signed build, never X's to hand out\n"


@dataclass
class Attack:
    job_id: str
    project: str
    other_project: str
    agent_id: str
    session: JobSession
    bucket: str
    q_key: str  # an object of project Q's, which X's session cannot even read
    stage_index: int = 0
    shard: int | None = None  # the shard claimed, for a stage with shards

    def dynamodb(self, stack) -> Any:
        return client_as(
            stack,
            "dynamodb",
            self.session.access_key_id,
            self.session.secret_access_key,
            self.session.session_token,
        )


def _claimed(
    stack, tmp_path: Path, bound: int | None = None, stages: list[dict[str, Any]] | None = None
) -> Attack:
    """Job X of a fresh project P, claimed by an eu-west agent through the claim route: the session
    its claim is answered with. Q's object stored beside it by Q (the test's admin)."""
    suffix = secrets.token_hex(3)
    p, q = f"p-loc-{suffix}", f"q-loc-{suffix}"
    extra = {"artifact": {"max_total_bytes": bound}} if bound is not None else {}
    job_id = start_job(stack, p, stages or [{"name": "build", "run": "true"}], **extra)
    task, _ = receive_stage(stack, job_id)
    agent_id = f"mac-{suffix}"
    routes = ClaimRoutes(
        stack.api_url, "eu-west", stack.region, credentials=lambda: _agent_credentials(stack)
    )
    granted = routes.claim(
        ClaimRequest(
            job_id=job_id,
            stage_index=task["stage_index"],
            shard=task.get("shard"),
            attempt=task["attempt"],
            agent_id=agent_id,
            claim_secret=new_claim_secret(),
            dispatch_key=task["dispatch_key"],
            dispatch_token=task["task_token"],
            accept=False,
        )
    )
    bucket = stack.resources["ArtifactBucket"]
    q_key = f"{q}/job_{'0' * 24}{suffix[:2]}/build/secret.ipa"
    client("s3").put_object(Bucket=bucket, Key=q_key, Body=SECRET)
    return Attack(
        job_id, p, q, agent_id, granted.session, bucket, q_key, task["stage_index"], task.get("shard")
    )


def _agent_credentials(stack):
    from botocore.credentials import ReadOnlyCredentials

    found = stack.agent_credentials["eu-west"]
    return ReadOnlyCredentials(found.access_key_id, found.secret_access_key, found.session_token)


def _forged_artifact(attack: Attack, path: str, size: int, uploaded_at: str) -> dict[str, Any]:
    """An artifact record of X as an agent could put it, its `uri` Q's object."""
    return {
        "pk": {"S": f"ARTIFACTS#{attack.job_id}"},
        "sk": {"S": f"build#{path}"},
        "job_id": {"S": attack.job_id},
        "stage": {"S": "build"},
        "path": {"S": path},
        "uri": {"S": f"s3://{attack.bucket}/{attack.q_key}"},
        "size": {"N": str(size)},
        "sha256": {"S": hashlib.sha256(SECRET).hexdigest()},
        "bucket_region": {"S": "us-east-1"},
        "cross_region_bytes": {"N": "0"},
        "attempt": {"N": "1"},
        "agent_id": {"S": attack.agent_id},
        "uploaded_at": {"S": uploaded_at},
        "ttl": {"N": "1900000000"},
    }


def _versions(attack: Attack) -> list[tuple[str, bool]]:
    """Every version and delete marker of Q's object: (kind, is latest)."""
    listed = client("s3").list_object_versions(Bucket=attack.bucket, Prefix=attack.q_key)
    return [("version", v["IsLatest"]) for v in listed.get("Versions", []) if v["Key"] == attack.q_key] + [
        ("delete marker", m["IsLatest"]) for m in listed.get("DeleteMarkers", []) if m["Key"] == attack.q_key
    ]


def test_an_artifact_record_pointing_at_another_projects_object_gets_no_link(local_stack, tmp_path):
    # Given job X's agent, with X's own session, records an artifact whose uri is project Q's object,
    attack = _claimed(local_stack, tmp_path)
    attack.dynamodb(local_stack).put_item(
        TableName=local_stack.table_name,
        Item=_forged_artifact(attack, "app.ipa", len(SECRET), datetime.now(UTC).isoformat()),
    )
    api = RelevoApi.for_stack(local_stack)
    try:
        # When a viewer of X asks for the artifact's download link,
        with pytest.raises(ApiError) as refused:
            api.artifact_link(attack.job_id, "app.ipa")
        # Then it is refused with the stable code, and no link is given.
        assert (refused.value.status, refused.value.code) == (409, "LOCATION_OUTSIDE_JOB"), refused.value
        assert "X-Amz-Signature" not in str(refused.value) and attack.q_key not in str(refused.value)
    finally:
        api.cancel_job(attack.job_id)


def test_the_quota_remover_deletes_nothing_of_another_project_and_still_removes_the_jobs_own(
    local_stack, tmp_path
):
    # Given project P bounded at 100 bytes, its job X's own 300-byte artifact uploaded by its
    # agent, and an artifact record X's agent forged with X's session: its uri Q's object, its
    # upload the oldest (the remover's first pick) and its size covered by the total,
    attack = _claimed(local_stack, tmp_path, bound=100)
    ref = stage_attempts.StageRef(local_stack.table_name, attack.job_id, 0, 1, attack.agent_id)
    files = tmp_path / "out"
    files.mkdir()
    (files / "own.ipa").write_bytes(b"x" * 300)
    api = RelevoApi.for_stack(local_stack)
    try:
        attack.dynamodb(local_stack).put_item(
            TableName=local_stack.table_name,
            Item=_forged_artifact(attack, "forged.ipa", 10, "2000-01-01T00:00:00+00:00"),
        )
        upload_artifacts(
            ref,
            "build",
            files,
            f"s3://{attack.bucket}/{attack.project}/{attack.job_id}/",
            "us-east-1",
            print,
            1_900_000_000,
        )
    finally:
        # When X ends (its artifacts become removable) and ArtifactQuotaFunction runs off the stream,
        api.cancel_job(attack.job_id)

    def stored() -> dict[str, bool]:
        return {
            r.path: r.removed_at is None
            for r in artifact_store.list_artifacts(local_stack.table_name, attack.job_id)
        }

    wait_until(lambda: stored().get("own.ipa") is False, 30, "X's own artifact removed by the bound")
    # Then X's own artifact went (record marked, object deleted), the forged one was neither
    # counted nor removed, and Q's object is still there: one version, the latest, no delete marker.
    assert stored() == {"own.ipa": False, "forged.ipa": True}
    assert artifact_usage.get_usage(local_stack.table_name, attack.project).bytes == 0
    assert artifact_usage.get_usage(local_stack.table_name, attack.other_project).bytes == 0
    assert _versions(attack) == [("version", True)]
    assert client("s3").get_object(Bucket=attack.bucket, Key=attack.q_key)["Body"].read() == SECRET


def test_a_log_chunk_whose_body_is_another_projects_object_is_not_shown(local_stack, tmp_path):
    # Given X's agent writes a log chunk whose body is an object of Q's (its sha256 the true one),
    attack = _claimed(local_stack, tmp_path)
    q_body = attack.q_key.replace("build/secret.ipa", ".relevo-logs/build/1/0123.log")
    client("s3").put_object(Bucket=attack.bucket, Key=q_body, Body=SECRET)
    attack.dynamodb(local_stack).put_item(
        TableName=local_stack.table_name,
        Item={
            "pk": {"S": f"LOGS#{attack.job_id}"},
            "sk": {"S": "SEQ#000000000000"},
            "job_id": {"S": attack.job_id},
            "seq": {"N": "0"},
            "stage": {"S": "build"},
            "attempt": {"N": "1"},
            "agent_id": {"S": attack.agent_id},
            "data": {"S": ""},
            "written_at": {"S": datetime.now(UTC).isoformat()},
            "body": {"S": f"s3://{attack.bucket}/{q_body}"},
            "body_sha256": {"S": hashlib.sha256(SECRET).hexdigest()},
            "size": {"N": str(len(SECRET))},
        },
    )
    api = RelevoApi.for_stack(local_stack)
    try:
        # When a viewer reads X's log (the log route, and the job view's tail),
        page = api.request("GET", f"/jobs/{attack.job_id}/logs")
        tail = api.get_job(attack.job_id)["log_tail"]["lines"]
        # Then the chunk says it cannot be shown, and not a byte of Q's body is.
        [chunk] = page["chunks"]
        assert (
            chunk["text"].startswith("[relevo] chunk 0 of this log cannot be shown")
            and "LOCATION_OUTSIDE_JOB" in chunk["text"]
        )
        assert SECRET.decode().strip() not in json.dumps(page) + json.dumps(tail)
    finally:
        api.cancel_job(attack.job_id)


def test_a_shards_log_chunk_whose_body_is_another_projects_object_is_shown_by_no_reader(
    local_stack, tmp_path, caplog
):
    # Given a shard of job X, claimed: its session writes its own log partition (LOGS#<job>/<stage>/<shard>),
    # a line, then a chunk whose body is an object of Q's (its sha256 the true one)
    attack = _claimed(local_stack, tmp_path, stages=[{"name": "test", "run": "true", "parallel": 2}])
    stage_index, shard = attack.stage_index, attack.shard
    assert shard is not None
    q_body = attack.q_key.replace("build/secret.ipa", ".relevo-logs/test/1/0123.log")
    client("s3").put_object(Bucket=attack.bucket, Key=q_body, Body=SECRET)
    now = datetime.now(UTC)
    common = {
        "pk": {"S": log_pk(attack.job_id, stage_index, shard)},
        "job_id": {"S": attack.job_id},
        "stage": {"S": "test"},
        "shard": {"N": str(shard)},
        "attempt": {"N": "1"},
        "agent_id": {"S": attack.agent_id},
    }
    for item in (
        {
            **common,
            "sk": {"S": log_sk(0)},
            "seq": {"N": "0"},
            "data": {"S": "own line\n"},
            "written_at": {"S": now.isoformat()},
        },
        {
            **common,
            "sk": {"S": log_sk(1)},
            "seq": {"N": "1"},
            "data": {"S": ""},
            "written_at": {"S": (now + timedelta(seconds=1)).isoformat()},
            "body": {"S": f"s3://{attack.bucket}/{q_body}"},
            "body_sha256": {"S": hashlib.sha256(SECRET).hexdigest()},
            "size": {"N": str(len(SECRET))},
        },
    ):
        attack.dynamodb(local_stack).put_item(TableName=local_stack.table_name, Item=item)
    api = RelevoApi.for_stack(local_stack)
    caplog.set_level(logging.WARNING, logger="relevo_core.models.job_objects")
    refused = (
        "[relevo] chunk 1 of this log cannot be shown: its body is not one of the job's objects "
        "(LOCATION_OUTSIDE_JOB)\n"
    )
    try:
        # When a viewer reads X's log forward, back from its end, the job view's tail, and a follower
        forward = api.job_logs(attack.job_id)
        back = api.job_logs(attack.job_id, before_seq=forward["next_seq"], limit=1)
        tail = api.get_job(attack.job_id)["log_tail"]
        printed: list[str] = []
        LogFollower(
            fetch=lambda cursor: api.job_logs(attack.job_id, from_seq=cursor, limit=1),
            write=printed.append,
            sleep=lambda _: None,
        ).run(follow=False)
        # Then each shows the shard's own line and, for the forged chunk, that it cannot be shown
        assert [chunk["text"] for chunk in forward["chunks"]] == ["own line\n", refused]
        assert [chunk["text"] for chunk in back["chunks"]] == [refused]
        assert [line["text"] for line in tail["lines"]] == ["own line", refused.strip()]
        assert printed == ["own line\n", refused]
        # And not a byte of Q's body is in any of them
        assert SECRET.decode().strip() not in json.dumps([forward, back, tail, printed])
        # And read in this process (the job's prefix read from its record), the refusal is logged
        # with the record's own key: the shard's partition
        parts = log_chunks.job_log_parts(get_envelope(local_stack.table_name, attack.job_id))
        page = log_reads.read_forward(local_stack.table_name, attack.job_id, parts, {})
        assert [chunk.data for chunk in page.chunks] == ["own line\n", refused]
        assert f"record {log_pk(attack.job_id, stage_index, shard)} {log_sk(1)}: location" in caplog.text
    finally:
        api.cancel_job(attack.job_id)


def test_a_rerun_standing_on_a_manifest_outside_the_job_is_refused_before_anything_is_written(
    local_stack, tmp_path
):
    # Given X's agent records its build stage succeeded, handing on files whose manifest is Q's object,
    attack = _claimed(
        local_stack, tmp_path, stages=[{"name": "build", "run": "true"}, {"name": "test", "run": "true"}]
    )
    receipt = {
        "handoff": {
            "manifest": f"s3://{attack.bucket}/{attack.q_key}",
            "manifest_sha256": hashlib.sha256(SECRET).hexdigest(),
            "attempt": 1,
            "files": 1,
            "bytes": 1,
            "digest": "0" * 64,
            "stored_at": datetime.now(UTC).isoformat(),
        }
    }
    from relevo_core.store.codec import to_attribute

    attack.dynamodb(local_stack).update_item(
        TableName=local_stack.table_name,
        Key={"pk": {"S": f"STAGES#{attack.job_id}"}, "sk": {"S": "STAGE#00"}},
        UpdateExpression="SET #status = :succeeded, receipt = :receipt",
        ExpressionAttributeNames={"#status": "status"},
        ExpressionAttributeValues={":succeeded": {"S": "succeeded"}, ":receipt": to_attribute(receipt)},
    )
    api = RelevoApi.for_stack(local_stack)
    api.cancel_job(attack.job_id)
    wait_until(lambda: api.get_job(attack.job_id)["status"] == "canceled", 20, "X ended")
    before = {job["job_id"] for job in api.request("GET", f"/jobs?project={attack.project}")["jobs"]}
    # When an operator reruns X from its test stage (standing on build's handoff),
    with pytest.raises(ApiError) as refused:
        api.rerun_job(attack.job_id, "test")
    # Then the rerun is refused with the stable code, and no job was written.
    assert (refused.value.status, refused.value.code) == (409, "LOCATION_OUTSIDE_JOB"), refused.value
    assert {job["job_id"] for job in api.request("GET", f"/jobs?project={attack.project}")["jobs"]} == before
