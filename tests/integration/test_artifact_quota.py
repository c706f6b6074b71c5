"""artifact.max_job_bytes (issue 20): a stage whose files would take its job's artifacts past the
project's bound fails Relevo.Fatal.ArtifactQuota before anything is uploaded (no object, no
record); what the job's other stages stored counts, an earlier attempt of the same stage does not.
A stage's shards store and record their files each as its own, and count each other's."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relevo_agent.artifacts import ArtifactFailure, upload_artifacts
from relevo_core.aws import client
from relevo_core.models.errors import ErrorClass
from relevo_core.models.project import Project
from relevo_core.store import artifacts as artifact_store
from relevo_core.store import keys, stage_attempts, stage_claims

EXPIRES = 1_900_000_000


def _claimed(stack, job_id: str, index: int, stage: str, attempt: int = 1) -> stage_attempts.StageRef:
    ref = stage_attempts.StageRef(stack.table_name, job_id, index, attempt, "mac-a")
    client("dynamodb").put_item(
        TableName=stack.table_name,
        Item={"pk": {"S": f"STAGES#{job_id}"}, "sk": {"S": f"STAGE#{index:02d}"}, "stage": {"S": stage}},
    )
    stage_claims.claim(ref, 30, datetime.now(UTC))
    return ref


def _files(directory: Path, **sizes: int) -> Path:
    directory.mkdir(parents=True)
    for name, size in sizes.items():
        (directory / name).write_bytes(b"x" * size)
    return directory


def test_a_stage_over_the_jobs_artifact_quota_fails_before_uploading(local_stack, tmp_path: Path):
    bucket = local_stack.resources["ArtifactBucket"]
    job_id = "job_" + secrets.token_hex(8)
    uri = f"s3://{bucket}/quota/{job_id}/"
    upload_artifacts(
        _claimed(local_stack, job_id, 0, "build"),
        "build",
        _files(tmp_path / "build", app=3000),
        uri,
        "us-east-1",
        print,
        EXPIRES,
        max_job_bytes=5000,
    )

    sign = _claimed(local_stack, job_id, 1, "sign")
    with pytest.raises(ArtifactFailure) as refused:
        upload_artifacts(
            sign,
            "sign",
            _files(tmp_path / "sign", ipa=1500, dsym=1000),
            uri,
            "us-east-1",
            print,
            EXPIRES,
            max_job_bytes=5000,
        )
    assert refused.value.error_class is ErrorClass.ARTIFACT_QUOTA
    assert (
        refused.value.error_class.value == "Relevo.Fatal.ArtifactQuota"
        and not refused.value.error_class.retryable
    )
    assert "to 5500 bytes, over the project's artifact.max_job_bytes 5000 (other stages: 3000 bytes)" in str(
        refused.value
    )
    # Nothing of the refused stage was uploaded or recorded.
    listed = client("s3").list_objects_v2(Bucket=bucket, Prefix=f"quota/{job_id}/sign/")
    assert listed.get("KeyCount", 0) == 0
    assert [record.stage for record in artifact_store.list_artifacts(local_stack.table_name, job_id)] == [
        "build"
    ]

    # A retry of build replaces its own files: only the other stages count against it.
    retry = _claimed(local_stack, job_id, 0, "build", attempt=2)
    upload_artifacts(
        retry,
        "build",
        _files(tmp_path / "build-2", app=4900),
        uri,
        "us-east-1",
        print,
        EXPIRES,
        max_job_bytes=5000,
    )


def test_the_bound_is_a_project_setting_frozen_into_the_job():
    project = Project.model_validate(
        {
            "id": "quota",
            "repo": "acme/quota",
            "region_affinity": "eu-west",
            "stages": [{"name": "build", "run": "make"}],
            "artifact": {"max_job_bytes": 10**9},
        }
    )
    assert project.artifact.max_job_bytes == 10**9
    with pytest.raises(ValueError):
        Project.model_validate(
            {
                "id": "quota",
                "repo": "acme/quota",
                "region_affinity": "eu-west",
                "stages": [{"name": "build", "run": "make"}],
                "artifact": {"max_job_bytes": 0},
            }
        )


def test_the_job_view_gives_the_artifact_total_and_the_bound(local_stack, project_id, tmp_path: Path):
    from relevo_cli.api import RelevoApi
    from tests.helpers.stack import receive_stage, register_project

    register_project(
        local_stack, project_id, [{"name": "build", "run": "make"}], artifact={"max_job_bytes": 5000}
    )
    api = RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    _, receipt = receive_stage(local_stack, job_id)
    client("sqs").delete_message(
        QueueUrl=local_stack.work_queues["eu-west"], ReceiptHandle=receipt
    )  # no agent runs it
    try:
        ref = _claimed(local_stack, job_id, 0, "build", attempt=99)
        upload_artifacts(
            ref,
            "build",
            _files(tmp_path / "out", a=1200, b=300),
            f"s3://{local_stack.resources['ArtifactBucket']}/{project_id}/{job_id}/",
            "us-east-1",
            print,
            EXPIRES,
            max_job_bytes=5000,
        )
        view = api.get_job(job_id)
        assert (view["artifact_bytes"], view["artifact_max_job_bytes"]) == (1500, 5000)
        assert sorted(a["size"] for a in view["artifacts"]) == [300, 1200]
    finally:
        api.cancel_job(job_id)


def _shard_claimed(stack, job_id: str, shard: int, attempt: int = 1) -> stage_attempts.StageRef:
    ref = stage_attempts.StageRef(stack.table_name, job_id, 0, attempt, f"mac-{shard}", shard=shard)
    client("dynamodb").put_item(
        TableName=stack.table_name,
        Item={
            "pk": {"S": f"STAGES#{job_id}"},
            "sk": {"S": keys.shard_sk(0, shard)},
            "stage_name": {"S": "test"},
            "shard_index": {"N": str(shard)},
        },
    )
    stage_claims.claim(ref, 30, datetime.now(UTC))
    return ref


def test_each_shards_files_are_stored_and_recorded_as_its_own(local_stack, tmp_path: Path):
    """Two shards of one stage leaving the same name: each its own object (under
    <stage>/shard-<k>/) and record (with its shard), neither overwriting the other; a retry of a
    shard replaces that shard's only."""
    bucket = local_stack.resources["ArtifactBucket"]
    job_id = "job_" + secrets.token_hex(8)
    uri = f"s3://{bucket}/shards/{job_id}/"
    for shard in range(2):
        out = tmp_path / f"shard-{shard}"
        out.mkdir()
        (out / "app.ipa").write_text(f"shard {shard}\n")
        upload_artifacts(
            _shard_claimed(local_stack, job_id, shard), "test", out, uri, "us-east-1", print, EXPIRES
        )
    retried = tmp_path / "shard-1-again"
    retried.mkdir()
    (retried / "app.ipa").write_text("shard 1, attempt 2\n")
    upload_artifacts(
        _shard_claimed(local_stack, job_id, 1, attempt=2), "test", retried, uri, "us-east-1", print, EXPIRES
    )

    found = sorted(
        artifact_store.list_artifacts(local_stack.table_name, job_id), key=lambda record: record.shard
    )
    assert [(record.stage, record.shard, record.path, record.attempt, record.uri) for record in found] == [
        ("test", 0, "app.ipa", 1, f"s3://{bucket}/shards/{job_id}/test/shard-0/app.ipa"),
        ("test", 1, "app.ipa", 2, f"s3://{bucket}/shards/{job_id}/test/shard-1/app.ipa"),
    ]
    s3 = client("s3")
    for record, body in zip(found, ("shard 0\n", "shard 1, attempt 2\n"), strict=True):
        key = record.uri.removeprefix(f"s3://{bucket}/")
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode() == body
        assert record.sha256 == hashlib.sha256(body.encode()).hexdigest()
    assert [
        obj["Key"] for obj in s3.list_objects_v2(Bucket=bucket, Prefix=f"shards/{job_id}/")["Contents"]
    ] == [f"shards/{job_id}/test/shard-0/app.ipa", f"shards/{job_id}/test/shard-1/app.ipa"]


def test_a_shards_quota_counts_its_siblings_files_and_not_its_own_earlier_attempts(
    local_stack, tmp_path: Path
):
    bucket = local_stack.resources["ArtifactBucket"]
    job_id = "job_" + secrets.token_hex(8)
    uri = f"s3://{bucket}/quota/{job_id}/"
    upload_artifacts(
        _shard_claimed(local_stack, job_id, 0),
        "test",
        _files(tmp_path / "s0", app=3000),
        uri,
        "us-east-1",
        print,
        EXPIRES,
        max_job_bytes=5000,
    )
    upload_artifacts(
        _shard_claimed(local_stack, job_id, 1),
        "test",
        _files(tmp_path / "s1", app=1000),
        uri,
        "us-east-1",
        print,
        EXPIRES,
        max_job_bytes=5000,
    )

    # Shard 1's retry: its own first attempt does not count (it is replaced), shard 0's 3000 do.
    retry = _shard_claimed(local_stack, job_id, 1, attempt=2)
    with pytest.raises(ArtifactFailure) as refused:
        upload_artifacts(
            retry,
            "test",
            _files(tmp_path / "s1-again", app=2500),
            uri,
            "us-east-1",
            print,
            EXPIRES,
            max_job_bytes=5000,
        )
    assert refused.value.error_class is ErrorClass.ARTIFACT_QUOTA
    assert (
        "to 5500 bytes, over the project's artifact.max_job_bytes 5000 (other stages and shards: 3000 bytes)"
        in str(refused.value)
    )
    assert sorted(
        (record.shard, record.size)
        for record in artifact_store.list_artifacts(local_stack.table_name, job_id)
    ) == [(0, 3000), (1, 1000)]
    upload_artifacts(
        retry,
        "test",
        _files(tmp_path / "s1-fits", app=2000),
        uri,
        "us-east-1",
        print,
        EXPIRES,
        max_job_bytes=5000,
    )
    assert sorted(
        (record.shard, record.size)
        for record in artifact_store.list_artifacts(local_stack.table_name, job_id)
    ) == [(0, 3000), (1, 2000)]
