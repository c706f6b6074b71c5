"""Cached boto3 clients follow the endpoint: a process that points at a second stack and back
talks to the one it points at now."""

from __future__ import annotations

import pytest

from relevo_core.aws import client


def test_a_client_is_reused_per_endpoint_and_follows_a_change(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1111")
    first = client("sqs")
    assert client("sqs") is first
    assert first.meta.endpoint_url == "http://127.0.0.1:1111"

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:2222")
    assert client("sqs").meta.endpoint_url == "http://127.0.0.1:2222"

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1111")
    assert client("sqs") is first


def test_clients_follow_the_region_too(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert client("sqs").meta.region_name == "eu-west-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert client("sqs").meta.region_name == "us-west-2"


def test_clients_follow_the_credentials_too(monkeypatch: pytest.MonkeyPatch):
    # Two local stacks issue different keys: a client built for one must not sign for the other.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1111")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFIRSTSTACK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "first")
    first = client("sqs")
    assert first._request_signer._credentials.access_key == "AKIAFIRSTSTACK"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASECONDSTACK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "second")
    assert client("sqs")._request_signer._credentials.access_key == "AKIASECONDSTACK"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFIRSTSTACK")
    assert client("sqs") is first
