"""What an idle agent asks of SQS, counted (bench/agent.py times and weighs the idle agent; the
count is this test): nothing but long polls of its region's queue, each waiting poll_wait_sec, one
after the other. With the default poll_wait_sec of 20 s (SQS's longest wait, "Amazon SQS short and
long polling", SQS Developer Guide) that is at most 3 requests a minute per queue (issue 29).

An SQS long poll answers as soon as a message arrives or when its wait ends, so the count over a
window is set by the wait: the test waits 1 s per poll and scales what it counts to 20 s."""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from itertools import pairwise
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

WAIT_SEC = 1
WINDOW_SEC = 4.0


class _SqsRequests:
    """Every SQS request this process sends about one queue, as botocore makes it."""

    def __init__(self, queue_url: str) -> None:
        self.queue_url = queue_url
        self.seen: list[tuple[float, str, dict]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> _SqsRequests:
        from botocore.endpoint import Endpoint

        self._original = original = Endpoint.make_request
        recorder = self

        def make_request(endpoint, operation_model, request_dict):
            body = request_dict.get("body") or b""
            text = body.decode() if isinstance(body, bytes) else str(body)
            if operation_model.service_model.service_name == "sqs" and recorder.queue_url in text:
                with recorder._lock:
                    recorder.seen.append((time.monotonic(), operation_model.name, json.loads(text)))
            return original(endpoint, operation_model, request_dict)

        Endpoint.make_request = make_request
        return self

    def __exit__(self, *exc: object) -> None:
        from botocore.endpoint import Endpoint

        Endpoint.make_request = self._original


def test_an_idle_agent_only_long_polls_its_queue_at_most_three_times_a_minute(
    local_stack, tmp_path: Path
) -> None:
    from relevo_agent.config import AgentConfig
    from relevo_agent.journal import Journal
    from relevo_agent.service import Agent
    from relevo_core.aws import client

    # A queue of its own: nothing arrives, no other test's agent polls it.
    queue_url = client("sqs").create_queue(QueueName=f"idle-{secrets.token_hex(4)}")["QueueUrl"]
    config = AgentConfig(
        agent_id=f"mac-idle-{secrets.token_hex(3)}",
        region="eu-west",
        workspace_root=tmp_path / "ws",
        journal=tmp_path / "j.sqlite3",
        poll_wait_sec=WAIT_SEC,
        presence_interval_sec=300,
    )
    agent = Agent(
        config, local_stack.table_name, queue_url, Journal(config.journal), api_url=local_stack.api_url
    )
    with _SqsRequests(queue_url) as requests:
        runner = threading.Thread(target=agent.run, daemon=True)
        runner.start()
        try:
            began = time.monotonic()
            while time.monotonic() - began < WINDOW_SEC:  # the long polls themselves set the pace
                runner.join(0.2)
                assert runner.is_alive(), "the agent stopped while idle"
        finally:
            agent.signals = 1
            runner.join(WAIT_SEC + 10)
    assert not runner.is_alive()
    window = [(at, name, body) for at, name, body in requests.seen if at - began <= WINDOW_SEC]

    assert {name for _, name, _ in window} == {"ReceiveMessage"}, (
        "an idle agent asks SQS for nothing but messages"
    )
    assert all(
        body["WaitTimeSeconds"] == WAIT_SEC and body["MaxNumberOfMessages"] == 1 for _, _, body in window
    )
    # One poll after the other: never more than the window holds waits (and the one under way).
    assert 1 <= len(window) <= math.ceil(WINDOW_SEC / WAIT_SEC) + 1, [
        round(at - began, 2) for at, _, _ in window
    ]
    gaps = [later - earlier for (earlier, _, _), (later, _, _) in pairwise(window)]
    assert all(gap >= WAIT_SEC * 0.9 for gap in gaps), gaps

    # At the default wait the same loop makes at most 60 / 20 = 3 requests a minute.
    default_wait = AgentConfig.model_fields["poll_wait_sec"].default
    assert default_wait == 20 and 60 / default_wait <= 3
