"""artifact.max_total_bytes (issue 20): past a project's bound, the oldest ended jobs' artifacts are
removed (object deleted, record marked, audit entry) by ArtifactQuotaFunction off the table stream,
until the total is back within it; a live job's artifacts never are. The running total is counted
once per stream record, each artifact removed once, and it never goes below zero.

Given jobs on the local stack whose stage is claimed by the test (no agent runs it) and whose
artifacts are uploaded with the agent's own upload path."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from relevo_agent.artifacts import upload_artifacts
from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.main import app
from relevo_core.aws import client
from relevo_core.jobs.artifact_quota import enforce, handle_changes
from relevo_core.store import artifact_usage, stage_attempts, stage_claims
from relevo_core.store import artifacts as artifact_store
from relevo_core.store.audit import actions
from tests.helpers.stack import receive_stage, register_project, stream_captured, wait_until

EXPIRES = 1_900_000_000
runner = CliRunner()


def _files(directory: Path, sizes: dict[str, int]) -> Path:
    directory.mkdir(parents=True)
    for name, size in sizes.items():
        (directory / name).write_bytes(b"x" * size)
    return directory


def _job_with_artifacts(
    stack, api: RelevoApi, project_id: str, tmp_path: Path, sizes: dict[str, int], end: bool = True
) -> str:
    """A job of the project whose build stage uploaded files of these sizes; canceled (ended) unless `end` is
    False."""
    job_id = api.run_project(project_id, {"ref": "main", "request_id": secrets.token_hex(8)})["job_id"]
    try:
        _, receipt = receive_stage(stack, job_id, timeout=30)
    except TimeoutError as exc:
        raise AssertionError(api.get_job(job_id)) from exc
    client("sqs").delete_message(
        QueueUrl=stack.work_queues["eu-west"], ReceiptHandle=receipt
    )  # no agent runs it
    ref = stage_attempts.StageRef(stack.table_name, job_id, 0, 99, "mac-a")
    stage_claims.claim(ref, 300, datetime.now(UTC))
    bucket = stack.resources["ArtifactBucket"]
    upload_artifacts(
        ref,
        "build",
        _files(tmp_path / job_id, sizes),
        f"s3://{bucket}/{project_id}/{job_id}/",
        "us-east-1",
        print,
        EXPIRES,
    )
    if end:
        api.cancel_job(job_id)
    return job_id


def _stored(stack, job_id: str) -> dict[str, bool]:
    return {
        record.path: record.removed_at is None
        for record in artifact_store.list_artifacts(stack.table_name, job_id)
    }


def _object_exists(stack, project_id: str, job_id: str, name: str) -> bool:
    try:
        client("s3").head_object(
            Bucket=stack.resources["ArtifactBucket"], Key=f"{project_id}/{job_id}/build/{name}"
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchKey"):
            return False
        raise
    return True


def _usage(stack, project_id: str) -> int:
    return artifact_usage.get_usage(stack.table_name, project_id).bytes


def _s3_delete(bucket: str, key: str) -> None:
    client("s3").delete_object(Bucket=bucket, Key=key)


def test_the_oldest_ended_jobs_artifacts_go_first_and_a_live_jobs_never(
    local_stack, project_id, tmp_path: Path
):
    register_project(
        local_stack, project_id, [{"name": "build", "run": "make"}], artifact={"max_total_bytes": 5000}
    )
    api = RelevoApi.for_stack(local_stack)
    oldest = _job_with_artifacts(local_stack, api, project_id, tmp_path, {"a1.ipa": 1000, "a2.dsym": 1000})
    older = _job_with_artifacts(local_stack, api, project_id, tmp_path, {"b.ipa": 2000})
    wait_until(lambda: _usage(local_stack, project_id) == 4000, 20, "the two ended jobs' 4000 bytes counted")

    # When the live job's upload takes the project to 6500 bytes, over 5000,
    live = _job_with_artifacts(local_stack, api, project_id, tmp_path, {"c.ipa": 2500}, end=False)
    try:
        # then the oldest ended job's files go, oldest first, until the total is back within the bound.
        wait_until(lambda: _usage(local_stack, project_id) == 4500, 20, "the total back within the bound")
        assert _stored(local_stack, oldest) == {"a1.ipa": False, "a2.dsym": False}
        assert _stored(local_stack, older) == {"b.ipa": True}
        assert _stored(local_stack, live) == {"c.ipa": True}
        assert not _object_exists(local_stack, project_id, oldest, "a1.ipa")
        assert not _object_exists(local_stack, project_id, oldest, "a2.dsym")
        assert _object_exists(local_stack, project_id, older, "b.ipa") and _object_exists(
            local_stack, project_id, live, "c.ipa"
        )

        # Each removal is in the job's audit trail: stage, path, size, when and why.
        removals = sorted(
            (a["stage"], a["path"], a["size"], a["reason"])
            for a in actions(local_stack.table_name, oldest)
            if a["action"] == "artifact_removed"
        )
        assert removals == [
            (
                "build",
                "a1.ipa",
                1000,
                "artifact.max_total_bytes 5000: the project's artifacts totalled 6500 bytes",
            ),
            (
                "build",
                "a2.dsym",
                1000,
                "artifact.max_total_bytes 5000: the project's artifacts totalled 5500 bytes",
            ),
        ]

        # The job view lists them as removed by quota, with no download link.
        view = api.get_job(oldest)
        assert {a["name"]: (a["removed_reason"], bool(a["removed_at"])) for a in view["artifacts"]} == {
            "a1.ipa": ("artifact.max_total_bytes", True),
            "a2.dsym": ("artifact.max_total_bytes", True),
        }
        assert view["artifact_bytes"] == 0
        with pytest.raises(ApiError) as gone:
            api.artifact_link(oldest, "a1.ipa")
        assert (gone.value.status, gone.value.code) == (410, "ARTIFACT_REMOVED")

        stack_file = tmp_path / "stack.json"
        stack_file.write_text(json.dumps(local_stack.model_dump()))
        listed = runner.invoke(
            app, ["artifacts", "list", oldest, "--stack-file", str(stack_file)], terminal_width=250
        )
        assert listed.exit_code == 0, listed.output
        removed_at = view["artifacts"][0]["removed_at"]
        assert f"build/a1.ipa: removed by quota at {removed_at} (artifact.max_total_bytes)" in listed.output
        shown = runner.invoke(
            app, ["job", "show", oldest, "--stack-file", str(stack_file)], terminal_width=250
        )
        assert shown.exit_code == 0, shown.output
        assert "artifact build/a1.ipa (1000 bytes) removed by quota at" in shown.output

        # A repeat changes nothing: nothing is removed twice, the total stays.
        again = enforce(local_stack.table_name, project_id, datetime.now(UTC), _s3_delete)
        assert again is not None and again.removed == [] and again.total_after == 4500
        assert (
            len([a for a in actions(local_stack.table_name, oldest) if a["action"] == "artifact_removed"])
            == 2
        )
    finally:
        api.cancel_job(live)


def test_a_redelivered_stream_batch_counts_nothing_twice_and_the_total_never_goes_negative(
    local_stack, project_id, tmp_path: Path
):
    register_project(
        local_stack, project_id, [{"name": "build", "run": "make"}], artifact={"max_total_bytes": 10_000}
    )
    api = RelevoApi.for_stack(local_stack)
    with stream_captured(local_stack) as batches:
        job_id = _job_with_artifacts(local_stack, api, project_id, tmp_path, {"one.ipa": 700, "two.ipa": 300})
        wait_until(lambda: _usage(local_stack, project_id) == 1000, 20, "the 1000 bytes counted")
        wait_until(
            lambda: sum(
                r["dynamodb"]["Keys"]["pk"]["S"] == f"ARTIFACTS#{job_id}"
                for b in batches
                for r in b["Records"]
            )
            >= 2,
            20,
            "the artifact records' stream records captured",
        )
    records = [r for b in batches for r in b["Records"]]

    # Lambda delivers a stream record at least once: the same batch again adds nothing.
    handle_changes(local_stack.table_name, records, datetime.now(UTC), _s3_delete)
    assert _usage(local_stack, project_id) == 1000

    # A removal whose size the total does not cover (never counted) is refused, not taken below zero.
    record = next(
        r for r in artifact_store.list_artifacts(local_stack.table_name, job_id) if r.path == "one.ipa"
    )
    assert (
        artifact_usage.remove_for_quota(
            local_stack.table_name,
            project_id,
            record.model_copy(update={"size": 5000}),
            10,
            5000,
            datetime.now(UTC),
        )
        is False
    )
    assert _usage(local_stack, project_id) == 1000 and _stored(local_stack, job_id) == {
        "one.ipa": True,
        "two.ipa": True,
    }

    # Removed once; a second removal of the same record is refused and the total does not move.
    now = datetime.now(UTC)
    assert artifact_usage.remove_for_quota(local_stack.table_name, project_id, record, 10, 1000, now) is True
    assert artifact_usage.remove_for_quota(local_stack.table_name, project_id, record, 10, 1000, now) is False
    assert _usage(local_stack, project_id) == 300

    # Deleting the job takes what is still stored off the total (once), and nothing below zero.
    api.delete_job(job_id)
    wait_until(
        lambda: _usage(local_stack, project_id) == 0, 20, "the deleted job's stored 300 bytes taken off"
    )


def test_live_jobs_alone_over_the_bound_lose_nothing_and_it_is_recorded_once(
    local_stack, project_id, tmp_path: Path
):
    register_project(
        local_stack, project_id, [{"name": "build", "run": "make"}], artifact={"max_total_bytes": 1000}
    )
    api = RelevoApi.for_stack(local_stack)
    live = _job_with_artifacts(local_stack, api, project_id, tmp_path, {"big.ipa": 3000}, end=False)
    try:
        wait_until(
            lambda: artifact_usage.get_usage(local_stack.table_name, project_id).live_over_bound_at
            is not None,
            20,
            "the live-only overrun recorded",
        )
        assert _stored(local_stack, live) == {"big.ipa": True} and _usage(local_stack, project_id) == 3000
        first = artifact_usage.get_usage(local_stack.table_name, project_id).live_over_bound_at
        again = enforce(local_stack.table_name, project_id, datetime.now(UTC), _s3_delete)
        assert again is not None and again.live_over_bound and again.removed == []
        assert (
            artifact_usage.get_usage(local_stack.table_name, project_id).live_over_bound_at == first
        )  # recorded once
    finally:
        api.cancel_job(live)
    # Once the job has ended its artifacts may go: the total comes back within the bound.
    wait_until(lambda: _usage(local_stack, project_id) == 0, 20, "the ended job's artifacts removed")
    assert _stored(local_stack, live) == {"big.ipa": False}
    # The mark is cleared by its own write after the removal's (jobs/artifact_quota.enforce): the
    # total can read 0 a moment before it goes.
    wait_until(
        lambda: artifact_usage.get_usage(local_stack.table_name, project_id).live_over_bound_at is None,
        20,
        "the live-only overrun's mark cleared",
    )


def test_a_project_file_with_a_bad_bound_names_file_line_and_field(tmp_path: Path):
    from tests.helpers.stack_files import unreachable_stack_file

    stack_file = str(unreachable_stack_file(tmp_path))
    for value, message in (("0", "greater than or equal to 1"), ('"ten gigabytes"', "valid integer")):
        path = tmp_path / f"quota-{secrets.token_hex(2)}.yaml"
        path.write_text(
            "id: hello\nrepo: acme/hello\nregion_affinity: eu-west\nstages:\n  - name: build\n    run: make\n"
            f"artifact:\n  max_total_bytes: {value}\n"
        )
        result = runner.invoke(app, ["project", "apply", str(path), "--stack-file", stack_file])
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert (
            len(lines) == 1
            and lines[0].startswith(f"{path}:8: artifact.max_total_bytes: ")
            and message in lines[0]
        ), result.output
