"""Cached boto3 clients follow the endpoint: a process that points at a second stack and back
talks to the one it points at now."""

from __future__ import annotations

from typing import Any

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


def test_a_call_under_a_budget_gives_up_within_it_and_makes_one_attempt(
    monkeypatch: pytest.MonkeyPatch, black_hole: str
):
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


# What the agent calls of each service (its own credentials and its jobs'), one operation each:
# where botocore sends the request and what it signs it for depend on the service and region only.
AGENT_CALLS = [
    (
        "sqs",
        "receive_message",
        {"QueueUrl": "https://sqs.{region}.amazonaws.com/123456789012/relevo-work-eu-west"},
    ),
    (
        "dynamodb",
        "get_item",
        {"TableName": "relevo-Table", "Key": {"pk": {"S": "AGENTS#eu-west"}, "sk": {"S": "AGENT#a"}}},
    ),
    ("stepfunctions", "send_task_heartbeat", {"taskToken": "token"}),
    ("secretsmanager", "get_secret_value", {"SecretId": "relevo/relevo/_signing/eu-west/app/dist.p12"}),
    ("sts", "get_caller_identity", {}),
    ("cloudformation", "describe_stacks", {"StackName": "relevo"}),
]
REGIONS = ["us-east-1", "eu-west-1", "ap-southeast-2", "us-gov-west-1", "cn-north-1"]


def _sent(session, service: str, region: str, operation: str, params: dict) -> tuple[str, str, str]:
    """(URL, signing region, signing service) of the request botocore would send: stopped before it leaves."""
    import re

    class Sent(Exception):
        pass

    seen: dict[str, str] = {}

    def before_send(request: Any, **_: Any) -> None:
        auth = request.headers["Authorization"]
        auth = auth.decode() if isinstance(auth, bytes) else auth
        seen["url"] = request.url
        seen["region"], seen["service"] = re.search(r"Credential=[^/]+/\d+/([^/]+)/([^/]+)/", auth).groups()
        raise Sent()

    made = session.client(
        service, region_name=region, aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret"
    )
    made.meta.events.register("before-send", before_send)
    with pytest.raises(Sent):
        getattr(made, operation)(
            **{k: v.format(region=region) if isinstance(v, str) else v for k, v in params.items()}
        )
    return seen["url"], seen["region"], seen["service"]


@pytest.mark.parametrize("region", REGIONS)
def test_the_agents_lean_clients_send_and_sign_as_clients_with_botocores_whole_endpoint_table(
    region, monkeypatch
):
    """relevo_core.aws.lean_endpoints (the agent's 6 MB): without endpoints.json, every request
    the agent makes of each service still goes where, and is signed for what, a client with the
    whole table sends and signs it, in every partition (aws, aws-us-gov, aws-cn)."""
    from relevo_core import aws

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    lean, full = aws._session.__wrapped__(None, True), aws._session.__wrapped__(None, False)
    for service, operation, params in AGENT_CALLS:
        assert _sent(lean, service, region, operation, params) == _sent(
            full, service, region, operation, params
        ), service
    # And the lean session indeed goes without the table: what it loaded names no endpoints.json.
    loader = lean._session.get_component("data_loader")
    assert not [key for key in loader._cache if "endpoints" in str(key)]


def test_s3_keeps_the_endpoint_table_in_a_lean_process(monkeypatch):
    from relevo_core import aws

    monkeypatch.setattr(aws, "_LEAN_ENDPOINTS", True)
    assert aws._lean("dynamodb") and not aws._lean("s3")
