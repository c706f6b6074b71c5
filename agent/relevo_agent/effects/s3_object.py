"""`s3_object`: a file put at an S3 key once, with its sha256 (docs/release-effects.md).

The put is one PutObject, all or nothing, carrying:
- `ChecksumSHA256`, the file's sha256 in base64: S3 checks the bytes it received against it and
  keeps it with the object, so a HeadObject with `ChecksumMode=ENABLED` gives it back ("Checking
  object integrity in Amazon S3", docs.aws.amazon.com/AmazonS3/latest/userguide/
  checking-object-integrity.html; the checksum is returned only when asked for).
- the operation id as user metadata (x-amz-meta-relevo-operation-id): whose put it was.
- `IfNoneMatch: "*"`, S3's conditional write: the put fails with 412 PreconditionFailed when the
  key already holds an object, never overwriting it ("How to prevent object overwrites with
  conditional writes", docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html); two
  such puts racing for one key: one wins, the other gets 409 ConditionalRequestConflict.

The probe is a HeadObject: the same sha256 and this operation's id is done; no object is absent;
anything else (another object at the key, an error) cannot tell. A put is never "in progress".

Credentials: the stage's `aws_profile` when its plan has one (the profile as the agent's AWS
configuration names it), else the job's session (relevo_core.aws.client under the attempt's job
scope), whose policy reaches the stack's own buckets only.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.effects.kind import Answer, EffectContext, EffectFailed, ProbeAnswer
from relevo_core.aws import call_budget, client, error_code
from relevo_core.models.effect import S3Object
from relevo_core.models.errors import ErrorClass

# The metadata key whose value names the operation that put the object (S3 lowercases user
# metadata keys: what HeadObject returns is this spelling).
OPERATION_METADATA = "relevo-operation-id"
# A single PutObject takes at most 5 GiB (Amazon S3 User Guide, "Uploading objects").
MAX_PUT_BYTES = 5 * 1024**3
# How long a probe's HeadObject may take.
PROBE_BUDGET_SEC = 30.0
# S3's answers to a request it refused for good: bad input, nothing written.
_REFUSED = frozenset({"AccessDenied", "NoSuchBucket", "InvalidBucketName", "InvalidRequest", "BadDigest"})


def sha256_of(path: os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def _base64(sha256_hex: str) -> str:
    return base64.b64encode(bytes.fromhex(sha256_hex)).decode()


class S3ObjectEffect:
    """`s3`: builds the S3 client the effect uses (the job session's by default)."""

    def __init__(self, spec: S3Object, s3: Callable[[], Any] | None = None) -> None:
        self.spec = spec
        self._s3 = s3 or (lambda: client("s3"))

    @classmethod
    def with_profile(cls, spec: S3Object, aws_profile: str | None) -> S3ObjectEffect:
        """The kind as a stage's plan has it: its aws_profile's credentials when it names one."""
        if aws_profile is None:
            return cls(spec)

        def profile_client() -> Any:
            import boto3

            # AWS_ENDPOINT_URL (the local stack) is read by boto3 itself, as for every client.
            return boto3.session.Session(profile_name=aws_profile).client("s3")

        return cls(spec, profile_client)

    @property
    def uri(self) -> str:
        return f"s3://{self.spec.bucket}/{self.spec.key}"

    def perform(self, context: EffectContext) -> dict[str, str]:
        size = context.file.stat().st_size
        if size > MAX_PUT_BYTES:
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED,
                f"{self.spec.file} is {size:,} bytes: one S3 put takes at most {MAX_PUT_BYTES:,}",
            )
        sha256 = sha256_of(context.file)
        values = {"s3_uri": self.uri, "sha256": sha256}
        # Before the put can have happened: a later attempt probes for exactly this.
        context.record(values)
        context.line(f"[relevo] effect s3_object: putting {self.spec.file} at {self.uri} (sha256 {sha256})")
        try:
            with call_budget(max(1.0, context.time_left())), open(context.file, "rb") as body:
                answer = self._s3().put_object(
                    Bucket=self.spec.bucket,
                    Key=self.spec.key,
                    Body=body,
                    # The algorithm named beside its value (S3 takes either alone; moto keeps the
                    # checksum only when the algorithm is named).
                    ChecksumAlgorithm="SHA256",
                    ChecksumSHA256=_base64(sha256),
                    Metadata={OPERATION_METADATA: context.operation_id},
                    IfNoneMatch="*",
                )
        except ClientError as exc:
            code = error_code(exc)
            if code == "PreconditionFailed":
                return self._already_there(context, sha256)
            raise self._failure(code, exc) from None
        except BotoCoreError as exc:
            # The put may have landed: the retry probes before it puts again.
            raise EffectFailed(ErrorClass.NETWORK_TIMEOUT, f"{self.uri}: {type(exc).__name__}") from None
        done = {**values, "etag": str(answer.get("ETag", "")).strip('"')}
        if answer.get("VersionId"):
            done["version_id"] = str(answer["VersionId"])
        return done

    def _already_there(self, context: EffectContext, sha256: str) -> dict[str, str]:
        """412: the key holds an object. This operation's own (an earlier put whose answer was
        lost) is the effect done; another is refused, never overwritten."""
        found = self.probe(context, {"sha256": sha256})
        if found.answer is Answer.DONE:
            context.line(f"[relevo] effect s3_object: {self.uri} already holds this operation's object")
            return dict(found.values)
        raise EffectFailed(
            ErrorClass.EFFECT_REFUSED,
            f"{self.uri} already holds an object (412 PreconditionFailed): nothing was overwritten; "
            f"{found.evidence}",
        )

    def _failure(self, code: str, exc: ClientError) -> EffectFailed:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in _REFUSED or (400 <= int(status or 0) < 500 and code != "ConditionalRequestConflict"):
            return EffectFailed(ErrorClass.EFFECT_REFUSED, f"{self.uri}: S3 refused the put ({code})")
        # 5xx, throttling, a 409 conflict with a racing put: a retry probes first.
        return EffectFailed(ErrorClass.STORAGE_5XX, f"{self.uri}: the put did not go through ({code})")

    def probe(self, context: EffectContext, recorded: Mapping[str, str]) -> ProbeAnswer:
        try:
            expected = sha256_of(context.file) if context.file.is_file() else recorded.get("sha256", "")
            with call_budget(min(PROBE_BUDGET_SEC, max(1.0, context.time_left()))):
                head = self._s3().head_object(
                    Bucket=self.spec.bucket, Key=self.spec.key, ChecksumMode="ENABLED"
                )
        except ClientError as exc:
            code = error_code(exc)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("404", "NoSuchKey", "NotFound") or status == 404:
                return ProbeAnswer(Answer.ABSENT, f"{self.uri}: no object")
            return ProbeAnswer(Answer.CANNOT_TELL, f"{self.uri}: HeadObject failed ({code})")
        except (BotoCoreError, OSError) as exc:
            return ProbeAnswer(Answer.CANNOT_TELL, f"{self.uri}: HeadObject failed ({type(exc).__name__})")
        owner = (head.get("Metadata") or {}).get(OPERATION_METADATA, "")
        found_sha = head.get("ChecksumSHA256") or ""
        etag = str(head.get("ETag", "")).strip('"')
        evidence = (
            f"{self.uri}: etag {etag}, operation {owner or '(none)'}, sha256 (base64) {found_sha or '(none)'}"
        )
        if owner == context.operation_id and expected and found_sha == _base64(expected):
            values = {"s3_uri": self.uri, "sha256": expected, "etag": etag}
            if head.get("VersionId"):
                values["version_id"] = str(head["VersionId"])
            return ProbeAnswer(Answer.DONE, evidence, values)
        return ProbeAnswer(Answer.CANNOT_TELL, f"another object: {evidence}")

    def resume(self, context: EffectContext, recorded: Mapping[str, str]) -> dict[str, str]:
        # A put is all or nothing: the probe never finds one in progress. Asked all the same, it
        # tells again what it finds, and starts nothing.
        found = self.probe(context, recorded)
        if found.answer is Answer.DONE:
            return dict(found.values)
        raise EffectFailed(ErrorClass.EFFECT_REFUSED, f"no put of {self.uri} to resume: {found.evidence}")
