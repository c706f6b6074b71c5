"""The s3_object kind against the local stack's S3 (issue 44, point 2): the file put once with its
sha256 (ChecksumSHA256) and the operation id, never over another object (IfNoneMatch "*": S3's
412 PreconditionFailed), and each answer of its probe."""

from __future__ import annotations

import base64
import hashlib
import secrets
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from relevo_agent.effects.kind import Answer, EffectContext, EffectFailed
from relevo_agent.effects.s3_object import OPERATION_METADATA, S3ObjectEffect
from relevo_core.aws import client
from relevo_core.models.effect import S3Object
from relevo_core.models.errors import ErrorClass
from tests.helpers.effect_context import Attempt

OP = "job_0000000000aaaaaaaaaaaaaaaa:publish"
BODY = b"the app, zipped\n" * 1000


@pytest.fixture()
def bucket(local_stack) -> str:
    name = "downloads-" + secrets.token_hex(4)
    client("s3").create_bucket(Bucket=name)
    return name


def _spec(bucket: str, key: str = "app/App.zip") -> S3Object:
    return S3Object(kind="s3_object", file="build/App.zip", bucket=bucket, key=key)


def _workspace(tmp_path: Path, body: bytes = BODY) -> Path:
    (tmp_path / "build").mkdir(parents=True, exist_ok=True)
    (tmp_path / "build" / "App.zip").write_bytes(body)
    return tmp_path


def _context(workspace: Path) -> tuple[EffectContext, Attempt]:
    attempt = Attempt()
    return attempt.context(workspace / "build" / "App.zip", OP, workspace=workspace), attempt


def _put_other(bucket: str, key: str, operation: str = "job_other:publish", body: bytes = b"another") -> None:
    client("s3").put_object(
        Bucket=bucket,
        Key=key,
        Body=body,
        ChecksumAlgorithm="SHA256",
        ChecksumSHA256=base64.b64encode(hashlib.sha256(body).digest()).decode(),
        Metadata={OPERATION_METADATA: operation},
    )


def test_perform_records_then_puts_the_file_once_with_its_sha256_and_operation(bucket, tmp_path):
    # Given a file in the workspace and an empty key; a record that looks at the key when called
    workspace = _workspace(tmp_path)
    kind = S3ObjectEffect(_spec(bucket))
    context, seen = _context(workspace)
    at_record: list[int] = []
    original = context.record

    def record(values: dict[str, str]) -> None:
        at_record.append(len(client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])))
        original(values)

    context = context.__class__(**{**context.__dict__, "record": record})

    # When the effect is performed
    values = kind.perform(context)

    # Then its identifiers were recorded before the object existed, and the object is the file,
    # carrying its sha256 and the operation id
    sha256 = hashlib.sha256(BODY).hexdigest()
    assert at_record == [0]
    assert seen.records[0] == {"s3_uri": f"s3://{bucket}/app/App.zip", "sha256": sha256}
    assert values["sha256"] == sha256 and values["s3_uri"] == f"s3://{bucket}/app/App.zip" and values["etag"]
    head = client("s3").head_object(Bucket=bucket, Key="app/App.zip", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(bytes.fromhex(sha256)).decode()
    assert head["Metadata"] == {OPERATION_METADATA: OP}
    assert client("s3").get_object(Bucket=bucket, Key="app/App.zip")["Body"].read() == BODY


def test_s3_refuses_a_conditional_put_over_an_existing_key_with_412(bucket):
    # Given a key that holds an object
    _put_other(bucket, "taken")

    # When a put with IfNoneMatch "*" is sent (S3 User Guide, "How to prevent object overwrites
    # with conditional writes")
    with pytest.raises(ClientError) as caught:
        client("s3").put_object(Bucket=bucket, Key="taken", Body=b"new", IfNoneMatch="*")

    # Then S3 answers 412 PreconditionFailed and the object is unchanged
    assert caught.value.response["Error"]["Code"] == "PreconditionFailed"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client("s3").get_object(Bucket=bucket, Key="taken")["Body"].read() == b"another"


def test_perform_never_overwrites_another_object(bucket, tmp_path):
    # Given another operation's object at the key
    _put_other(bucket, "app/App.zip")
    context, _ = _context(_workspace(tmp_path))

    # When the effect is performed
    with pytest.raises(EffectFailed) as caught:
        S3ObjectEffect(_spec(bucket)).perform(context)

    # Then it is refused for good, naming the 412, and the object is untouched
    assert caught.value.error_class is ErrorClass.EFFECT_REFUSED
    assert "412 PreconditionFailed" in caught.value.message
    assert client("s3").get_object(Bucket=bucket, Key="app/App.zip")["Body"].read() == b"another"


def test_perform_finds_its_own_put_whose_answer_was_lost(bucket, tmp_path):
    # Given this operation's object already at the key (a put whose answer never came back)
    workspace = _workspace(tmp_path)
    _put_other(bucket, "app/App.zip", operation=OP, body=BODY)
    context, _ = _context(workspace)

    # When the effect is performed again
    values = S3ObjectEffect(_spec(bucket)).perform(context)

    # Then the 412 is read as the effect done: its values, nothing put twice
    assert values["sha256"] == hashlib.sha256(BODY).hexdigest()
    versions = client("s3").list_objects_v2(Bucket=bucket)["Contents"]
    assert len(versions) == 1


def test_probe_done_for_this_operations_object(bucket, tmp_path):
    # Given the effect performed
    workspace = _workspace(tmp_path)
    kind = S3ObjectEffect(_spec(bucket))
    context, seen = _context(workspace)
    performed = kind.perform(context)

    # When a later attempt probes with what was recorded
    found = kind.probe(context, seen.recorded)

    # Then it is done, with the values perform left
    assert found.answer is Answer.DONE, found.evidence
    assert dict(found.values) == {k: v for k, v in performed.items() if k != "version_id"}


def test_probe_absent_when_nothing_is_at_the_key(bucket, tmp_path):
    # Given nothing at the key (the previous attempt died before its put, maybe before recording)
    context, _ = _context(_workspace(tmp_path))

    # When probed with nothing recorded
    found = S3ObjectEffect(_spec(bucket)).probe(context, {})

    # Then the effect is absent
    assert found.answer is Answer.ABSENT


@pytest.mark.parametrize(
    ("operation", "body"),
    [("job_other:publish", BODY), (OP, b"another build of the app")],
    ids=["another operation's", "another file under this operation"],
)
def test_probe_cannot_tell_for_another_object(bucket, tmp_path, operation: str, body: bytes):
    # Given an object at the key that is not this operation's file
    _put_other(bucket, "app/App.zip", operation=operation, body=body)
    context, _ = _context(_workspace(tmp_path))

    # When probed
    found = S3ObjectEffect(_spec(bucket)).probe(context, {"sha256": hashlib.sha256(BODY).hexdigest()})

    # Then it cannot tell (a person looks; nothing is overwritten)
    assert found.answer is Answer.CANNOT_TELL, found.evidence


def _unreachable() -> object:
    # Nothing listens on port 9 of this host: every request fails to connect.
    return boto3.session.Session().client(
        "s3",
        endpoint_url="http://127.0.0.1:9",
        config=Config(connect_timeout=0.5, read_timeout=0.5, retries={"total_max_attempts": 1}),
    )


def test_probe_cannot_tell_when_s3_cannot_be_reached(bucket, tmp_path):
    # Given S3 out of reach
    context, _ = _context(_workspace(tmp_path))

    # When probed
    found = S3ObjectEffect(_spec(bucket), _unreachable).probe(context, {})

    # Then it cannot tell, and raises nothing
    assert found.answer is Answer.CANNOT_TELL
    assert "HeadObject failed" in found.evidence


def test_perform_that_cannot_reach_s3_fails_transiently_after_recording(bucket, tmp_path):
    # Given S3 out of reach
    context, seen = _context(_workspace(tmp_path))

    # When the effect is performed
    with pytest.raises(EffectFailed) as caught:
        S3ObjectEffect(_spec(bucket), _unreachable).perform(context)

    # Then it fails with a retryable class (the retry probes first), its identifiers recorded
    assert caught.value.error_class.retryable
    assert seen.recorded["sha256"] == hashlib.sha256(BODY).hexdigest()
