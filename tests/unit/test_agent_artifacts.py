"""Artifact checks without AWS: read-back verification, storage error classes, progress lines."""

from __future__ import annotations

import hashlib

import pytest
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

from relevo_agent.artifacts import ArtifactFailure, Progress, classify_storage_error, verify
from relevo_core.models.errors import ErrorClass


def test_a_read_back_that_matches_passes():
    data = b"x" * 3_000_000
    verify(hashlib.sha256(data).hexdigest(), [data[:1000], data[1000:]], "s3://b/k")


def test_a_read_back_that_differs_is_a_checksum_failure():
    expected = hashlib.sha256(b"what was uploaded").hexdigest()
    with pytest.raises(ArtifactFailure) as failure:
        verify(expected, [b"what was ", b"read back"], "s3://b/k")
    assert failure.value.error_class is ErrorClass.CHECKSUM
    assert failure.value.error_class.value == "Relevo.Fatal.Checksum"
    assert not failure.value.error_class.retryable


def _client_error(status: int, code: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
    )


def _wrapped(error: ClientError) -> S3UploadFailedError:
    # What boto3's upload_file raises: the ClientError is its context.
    try:
        try:
            raise error
        except ClientError as exc:
            # As boto3 raises it: without `from`, so the ClientError is its __context__, not its __cause__.
            raise S3UploadFailedError(f"Failed to upload: {exc}")  # noqa: B904
    except S3UploadFailedError as wrapped:
        return wrapped


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_client_error(503, "SlowDown"), ErrorClass.STORAGE_5XX),
        (_wrapped(_client_error(500, "InternalError")), ErrorClass.STORAGE_5XX),
        (_wrapped(_client_error(403, "AccessDenied")), ErrorClass.CLIENT_4XX),
        (_client_error(404, "NoSuchBucket"), ErrorClass.CLIENT_4XX),
        (EndpointConnectionError(endpoint_url="https://s3"), ErrorClass.NETWORK_TIMEOUT),
        (ConnectionClosedError(endpoint_url="https://s3"), ErrorClass.CONNECTION_RESET),
    ],
)
def test_storage_errors_map_to_their_classes(error: Exception, expected: ErrorClass):
    assert classify_storage_error(error) is expected


def test_progress_lines_come_about_every_interval_then_a_completion_line():
    # Given a 100 MiB upload whose callbacks arrive every 0.5 s (injected clock)
    now = [0.0]
    lines: list[str] = []
    progress = Progress("app.ipa", 100 * 1024 * 1024, lines.append, clock=lambda: now[0], interval_sec=3.0)
    for _ in range(20):
        now[0] += 0.5
        progress(5 * 1024 * 1024)
    progress.done("ab" * 32)
    # Then one line per 3 s with bytes, percent and rate, and a completion line
    assert lines[:3] == [
        "[relevo] uploading app.ipa: 30.0 MiB of 100.0 MiB (30%) at 10.0 MiB/s",
        "[relevo] uploading app.ipa: 60.0 MiB of 100.0 MiB (60%) at 10.0 MiB/s",
        "[relevo] uploading app.ipa: 90.0 MiB of 100.0 MiB (90%) at 10.0 MiB/s",
    ]
    assert lines[3] == f"[relevo] uploaded app.ipa: 100.0 MiB in 10.0s (10.0 MiB/s), sha256 {'ab' * 32}"
    assert len(lines) == 4


def test_the_receipts_checksums_never_follow_a_link_the_build_left(tmp_path):
    """A link in RELEVO_ARTIFACT_DIR is not read (as the upload skips it): with run_as the agent
    could otherwise hash a file of its own that the build cannot read, into the receipt."""
    from relevo_agent.receipt import _checksums

    secret = tmp_path / "agent-only"
    secret.write_text("agent's")
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    (artifacts / "app.ipa").write_bytes(b"ipa")
    (artifacts / "stolen").symlink_to(secret)
    assert set(_checksums(artifacts)) == {"app.ipa"}
    linked = tmp_path / "linked"
    linked.symlink_to(artifacts)
    assert _checksums(linked) == {}
