"""Access pattern: a job's results documents (relevo_core.models.test_results), one S3 object per
stage or shard attempt under the job's prefix (`<project>/<job>/.relevo-tests/`), written by the
agent with the job's session and read whole by GET /jobs/{id}/tests."""

from __future__ import annotations

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code


def read_document(bucket: str, key: str) -> bytes | None:
    """The document's bytes, or None when it is not there. A reader with s3:ListBucket on the
    prefix gets 404 NoSuchKey for a missing key; one without would get 403 AccessDenied, which is
    not taken for "missing" (Amazon S3 API Reference, GetObject, "Permissions"): the job output
    function's role may list `*/*/.relevo-tests/*` (template.yaml)."""
    try:
        data: bytes = client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if error_code(exc) in ("NoSuchKey", "404"):
            return None
        raise
    return data
