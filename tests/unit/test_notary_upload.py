"""Where the notarization kind's upload goes (relevo_agent.effects.notary_client): Apple's bucket in
us-west-2, signed with the submission's temporary credentials only, whatever the agent's own
environment says (a local agent's AWS_ENDPOINT_URL points at its emulator, and its own credentials
are in its environment). The request is caught before it leaves: no network."""

from __future__ import annotations

from typing import Any

from botocore.awsrequest import AWSResponse

from relevo_agent.effects.notary_client import NotaryClient, UploadTarget

TARGET = UploadTarget(
    submission_id="2efe2717-52ef-43a5-96dc-0797e4ca1041",
    bucket="notary-submissions-prod",
    object="prefix/2efe2717-52ef-43a5-96dc-0797e4ca1041",
    access_key_id="ASIASUBMISSIONKEY",
    secret_access_key="submission-secret",
    session_token="submission-session-token",
)


class _Empty:
    def stream(self, **_: Any) -> list[bytes]:
        return [b""]


def _sent_put(client: NotaryClient) -> Any:
    s3 = client.s3_client(TARGET)
    sent: list[Any] = []

    def capture(request: Any, **_: Any) -> AWSResponse:
        sent.append(request)
        return AWSResponse(request.url, 200, {}, _Empty())

    s3.meta.events.register("before-send.s3.PutObject", capture)
    s3.put_object(Bucket=TARGET.bucket, Key=TARGET.object, Body=b"the file")
    (request,) = sent
    return request


def test_the_upload_goes_to_apples_bucket_with_the_submissions_credentials_whatever_the_environment(
    monkeypatch,
):
    # Given an agent whose environment points AWS at its emulator, with credentials of its own
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:5000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAAGENTSOWNKEY")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "agents-own-token")

    # When a submission's file is put
    request = _sent_put(NotaryClient("https://appstoreconnect.apple.com/notary/v2", token=lambda: "t"))

    # Then it goes to Apple's bucket in us-west-2, signed with the submission's credentials only
    assert request.url == f"https://notary-submissions-prod.s3.us-west-2.amazonaws.com/{TARGET.object}"
    authorization = request.headers["Authorization"].decode()
    assert "Credential=ASIASUBMISSIONKEY/" in authorization
    assert request.headers["X-Amz-Security-Token"].decode() == "submission-session-token"


def test_a_configured_upload_endpoint_is_addressed_path_style():
    # Given the local service's stand-in as the upload endpoint
    client = NotaryClient(
        "http://127.0.0.1:8123/notary/v2", token=lambda: "t", upload_endpoint="http://127.0.0.1:8123/s3"
    )

    # When a submission's file is put, then it goes to <endpoint>/<bucket>/<object>
    assert _sent_put(client).url == f"http://127.0.0.1:8123/s3/notary-submissions-prod/{TARGET.object}"
