"""The artifact links the job output function presigns, as AWS must see them: on the bucket's
regional virtual-hosted endpoint, signed for that region. The legacy global endpoint
`<bucket>.s3.amazonaws.com` is redirected (307) for a new bucket and refused (400) for a bucket of
a region launched after March 20, 2019 ("Virtual hosting of buckets", "Request routing", Amazon
S3 User Guide), and the host is part of the signature, so no one can fix a link up afterwards.
Locally the links name the emulator (tests/integration/test_iam_enforcement.py checks them there)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from relevo_core.aws import reset_clients, s3_presigner

BUCKET = "relevo-artifacts-123456789012"
KEY = "p-demo/job_0123/build/App.ipa"


@pytest.fixture()
def on_aws(monkeypatch: pytest.MonkeyPatch):
    """This process as a function on AWS in `region`: no endpoint override, the role's keys."""

    def in_region(region: str) -> None:
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        monkeypatch.setenv("AWS_DEFAULT_REGION", region)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIAFUNCTIONROLE")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
        monkeypatch.setenv("AWS_SESSION_TOKEN", "token")
        reset_clients()

    yield in_region
    reset_clients()


@pytest.mark.parametrize("region", ["ap-east-1", "me-south-1", "us-east-1", "eu-west-1"])
def test_a_link_names_the_buckets_regional_endpoint_and_is_signed_for_that_region(on_aws, region: str):
    # Given the function in `region`, an opt-in region (launched after March 2019) or us-east-1
    on_aws(region)
    # When it presigns a GET of an artifact
    url = s3_presigner().generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": KEY}, ExpiresIn=120
    )
    # Then the link names the bucket on its region's own endpoint, virtual-hosted
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == (
        "https",
        f"{BUCKET}.s3.{region}.amazonaws.com",
        f"/{KEY}",
    )
    # and its signature covers that host, in that region's credential scope
    query = parse_qs(parts.query)
    assert query["X-Amz-SignedHeaders"] == ["host"]
    _, _, scope_region, service, _ = query["X-Amz-Credential"][0].split("/")
    assert (scope_region, service) == (region, "s3")
