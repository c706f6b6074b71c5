"""Access pattern: the bodies of a job's large log chunks, one S3 object each under the job's
artifact prefix (`<artifact_uri>.relevo-logs/<stage>/<attempt>/<id>.log`).

Why S3: every chunk of a job's log shares one DynamoDB partition key (`LOGS#<job>`), and a
partition takes at most 1,000 write units a second ("each individual partition is limited to 1000
write units per second", DynamoDB Developer Guide; throttling reason
TableWriteKeyRangeThroughputExceeded). A chunk item costs 2 write units per KB in a transaction,
so inline chunks top out near 0.5 MB/s per job. A large chunk's body goes to S3 instead, and its
index item (a few hundred bytes: the seq, the object, its sha256 and size) stays in the fenced
transaction, so a job's log is bounded by S3's 3,500 PUTs a second per prefix ("Best practices
design patterns: optimizing Amazon S3 performance", Amazon S3 User Guide), not by one partition.

A body's key holds no seq: the seq is allocated when its index item is written, after the object
exists, and a body left without an index item (its writer fenced, or killed between the two) is
never shown, and expires with the job's artifacts (the bucket's lifecycle rule). Readers verify
each body against the sha256 its index item recorded.
"""

from __future__ import annotations

import base64
import hashlib
import uuid

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code

LOG_PREFIX = ".relevo-logs"


class BodyMissing(Exception):
    """The body an index item names is gone, or is not what it recorded."""


def body_key(artifact_uri: str, stage: str, attempt: int) -> tuple[str, str]:
    """(bucket, key) for a new body of `stage`'s attempt under the job's artifact prefix."""
    bucket, _, prefix = artifact_uri.removeprefix("s3://").partition("/")
    return bucket, f"{prefix.rstrip('/')}/{LOG_PREFIX}/{stage}/{attempt}/{uuid.uuid4().hex}.log"


def put_body(bucket: str, key: str, data: bytes) -> str:
    """Store a body; returns its sha256 (hex). Content-MD5 lets S3 refuse a body damaged on the way."""
    digest = hashlib.sha256(data).hexdigest()
    client("s3").put_object(
        Bucket=bucket,
        Key=key,
        Body=data,
        ContentType="text/plain; charset=utf-8",
        ContentMD5=base64.b64encode(hashlib.md5(data).digest()).decode(),  # noqa: S324 - S3's integrity header, not a secret
    )
    return digest


def get_body(bucket: str, key: str, sha256: str) -> str:
    """A body as its index item recorded it (BodyMissing otherwise)."""
    try:
        data = client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if error_code(exc) in ("NoSuchKey", "404"):
            raise BodyMissing(f"s3://{bucket}/{key} is gone") from exc
        raise
    if hashlib.sha256(data).hexdigest() != sha256:
        raise BodyMissing(f"s3://{bucket}/{key} is not the body its log chunk recorded (sha256)")
    return data.decode("utf-8", "replace")
