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


@pytest.fixture()
def black_hole():
    """An endpoint that accepts connections and never answers (a partition, as the agent sees it)."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_a_call_under_a_budget_gives_up_within_it_and_makes_one_attempt(monkeypatch: pytest.MonkeyPatch, black_hole: str):
    import time

    from botocore.exceptions import ReadTimeoutError

    from relevo_core.aws import call_budget

    monkeypatch.setenv("AWS_ENDPOINT_URL", black_hole)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    started = time.monotonic()
    with call_budget(1.0), pytest.raises(ReadTimeoutError):
        client("dynamodb").get_item(TableName="t", Key={"pk": {"S": "x"}})
    # Without the budget: 25 s read timeout, 3 attempts. With it: one attempt, half a second.
    assert time.monotonic() - started < 5.0  # not 3 x 25 s: a loaded machine may be slow to give up
    assert client("dynamodb").meta.config.read_timeout == 25  # outside the block, unchanged


def test_budgets_share_a_few_clients_and_every_call_gets_what_is_left(monkeypatch: pytest.MonkeyPatch):
    import time

    from relevo_core.aws import call_budget

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1111")
    with call_budget(5.5):
        five = client("stepfunctions")
        assert (five.meta.config.connect_timeout, five.meta.config.read_timeout) == (1.0, 4.0)
    with call_budget(5.2):
        assert client("stepfunctions") is five  # rounded down to the same steps: the same client
    with call_budget(4.9):
        assert client("stepfunctions").meta.config.read_timeout == 3.0
    with call_budget(2.0):
        first = client("dynamodb")
        time.sleep(1.0)
        second = client("dynamodb")  # the next call of the same round has only what is left
    assert first.meta.config.read_timeout + first.meta.config.connect_timeout <= 2.0
    assert second.meta.config.read_timeout + second.meta.config.connect_timeout <= 1.0
    with call_budget(0.01):
        assert client("stepfunctions").meta.config.read_timeout == 0.25


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
