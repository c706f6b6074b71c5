"""Commit statuses on the local stack: real jobs (webhook, state machine, stage reports), the
table's stream delivered to StatusReporterFunction as the template declares it, and a local
recorder standing in for GitHub and GitLab. Every GitHub call is checked against GitHub's
published REST description (tests/helpers/github_openapi.py)."""

from __future__ import annotations

import json
import secrets
import time
from urllib.parse import urlsplit

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.store.deliveries import project_deliveries
from tests.helpers.github_openapi import check_call
from tests.helpers.payloads import push_body
from tests.helpers.recorder import Recorder
from tests.helpers.stack import (
    deliver,
    job_record,
    job_stream_records,
    receive_stage,
    register_project,
    stream_captured,
    table_items,
    wait_for_execution,
    wait_until,
)
from tests.helpers.state_machine import agent_runs

BUILD = [{"name": "build", "run": "make"}]
GATED = [{"name": "build", "run": "make"}, {"name": "deploy", "run": "fastlane deliver"}]


@pytest.fixture()
def recorder():
    server = Recorder().start()
    yield server
    server.stop()


@pytest.fixture()
def forge(local_stack, project_id, recorder):
    """Registers the test's project reporting to the recorder; `start()` pushes a commit."""
    token = "tok_" + secrets.token_hex(16)
    token_ref = f"relevo/{local_stack.stack_name}/status/{project_id}"
    client("secretsmanager").create_secret(Name=token_ref, SecretString=token)

    class Forge:
        def __init__(self) -> None:
            self.token = token
            self.commit = secrets.token_hex(20)

        def register(self, stages=BUILD, provider="github", **extra) -> None:
            self.secret = register_project(
                local_stack, project_id, stages,
                commit_status={"provider": provider, "token_ref": token_ref, "api_url": recorder.url + ("/api/v4" if provider == "gitlab" else "")},
                **extra,
            )

        def push(self) -> str:
            response = deliver(local_stack, project_id, push_body(f"acme/{project_id}", self.commit), self.secret)
            assert response.status_code == 202, response.text
            return response.json()["job_id"]

        def statuses(self, count: int, timeout: float = 20) -> list:
            return wait_until(lambda: (found := recorder.received(self.commit)) and len(found) >= count and found, timeout,
                              f"{count} statuses for {self.commit}")

    return Forge()


def _run_all(stack, job_id, stages: int) -> None:
    for _ in range(stages):
        task, _ = receive_stage(stack, job_id)
        agent_runs(stack, task)


def _log(emulator) -> str:
    path = emulator.state_dir / "logs" / "StatusReporterFunction.log"
    return path.read_text() if path.exists() else ""


def test_each_transition_is_one_github_status_and_a_repeated_record_sends_nothing(local_stack, emulator, project_id, forge, recorder):
    with stream_captured(local_stack) as batches:
        forge.register(GATED, approval={"enabled": True})
        job_id = forge.push()
        _run_all(local_stack, job_id, 1)
        wait_until(lambda: job_record(local_stack, job_id).get("status") == "waiting", 15, "the gate")
        RelevoApi.for_stack(local_stack).approve(job_id, "ship it")
        _run_all(local_stack, job_id, 1)
        assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
        sent = forge.statuses(5)

    bodies = [r.json() for r in sent]
    assert [(b["state"], b["description"]) for b in bodies] == [
        ("pending", "queued"),
        ("pending", "running"),
        ("pending", f"waiting for approval of deploy: relevo approve {job_id}"),
        ("pending", "running"),
        ("success", "succeeded"),
    ]
    for request in sent:
        assert check_call(request.method, urlsplit(request.path).path, request.json()) == "repos/create-commit-status"
        assert request.path == f"/repos/acme/{project_id}/statuses/{forge.commit}"
        assert request.headers["authorization"] == f"Bearer {forge.token}"
    assert {b["context"] for b in bodies} == {f"relevo/{project_id}"}
    assert bodies[0]["target_url"].endswith(f"#/v2/executions/details/{local_stack.state_machine_arn.replace(':stateMachine:', ':execution:')}:{job_id}")

    records = project_deliveries(local_stack.table_name, project_id)
    assert sorted((r.target, r.event, r.outcome.value, r.http_status, r.attempt) for r in records) == sorted(
        [("github_status", e, "delivered", 201, 1) for e in ("queued", "running", "waiting", "running", "ended")]
    )

    # The same stream records again (a redelivery by the event source mapping): nothing is sent.
    ours = job_stream_records(batches, job_id)
    assert len(ours) >= 5
    response = emulator._runtimes["StatusReporterFunction"].invoke({"Records": ours})
    assert response == {"batchItemFailures": []}
    time.sleep(0.5)
    assert len(recorder.received(forge.commit)) == 5

    # The token is nowhere but in the Authorization header it was sent in.
    stored = json.dumps(table_items(local_stack, "DELIVERIES#") + table_items(local_stack, "NOTICES#"), default=str)
    assert forge.token not in stored and forge.token not in _log(emulator)


def test_500s_and_429s_are_retried_and_no_transition_is_lost(local_stack, project_id, forge, recorder):
    forge.register()
    recorder.answer(500)
    recorder.answer(429, headers={"Retry-After": "1"})
    recorder.answer(503)
    job_id = forge.push()
    _run_all(local_stack, job_id, 1)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

    sent = forge.statuses(6)  # 3 transitions, the first one after 3 failed attempts
    assert [(r.json()["state"], r.json()["description"]) for r in sent] == [("pending", "queued")] * 4 + [
        ("pending", "running"), ("success", "succeeded")
    ]
    attempts = sorted((r.event, r.attempt, r.http_status, r.outcome.value) for r in project_deliveries(local_stack.table_name, project_id))
    assert attempts == [
        ("ended", 1, 201, "delivered"),
        ("queued", 1, 500, "retrying"), ("queued", 2, 429, "retrying"), ("queued", 3, 503, "retrying"), ("queued", 4, 201, "delivered"),
        ("running", 1, 201, "delivered"),
    ]
    # The 429's Retry-After was honoured: its retry came a second or more after it.
    assert sent[2].at - sent[1].at >= 1.0


def test_gitlab_gets_its_commit_status_with_the_project_access_token(local_stack, project_id, forge, recorder):
    forge.register(provider="gitlab")
    job_id = forge.push()
    _run_all(local_stack, job_id, 1)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    sent = forge.statuses(3)
    assert [r.json()["state"] for r in sent] == ["pending", "running", "success"]
    assert {r.path for r in sent} == {f"/api/v4/projects/acme%2F{project_id}/statuses/{forge.commit}"}
    assert {r.headers["private-token"] for r in sent} == {forge.token}
    assert {r.json()["name"] for r in sent} == {f"relevo/{project_id}"} and {r.json()["ref"] for r in sent} == {"main"}


def test_a_hung_forge_never_delays_the_job_and_every_report_is_dead_lettered(local_stack, emulator, project_id, forge, recorder):
    forge.register(GATED[:1] + [{"name": "sign", "run": "codesign"}])
    recorder.hang_always(60)
    started = time.monotonic()
    job_id = forge.push()
    _run_all(local_stack, job_id, 2)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    took = time.monotonic() - started
    # Two stages handed over by a test agent take a few seconds; one hung report alone is 4 s
    # (StatusSendBudgetSeconds in tests/conftest.py), three would be 12.
    assert took < 8, f"the job took {took:.1f} s"

    sqs = client("sqs")
    queue = local_stack.resources["StatusDeadLetterQueue"]
    queue_url = queue if queue.startswith("http") else sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    messages: list[dict] = []

    def dead_lettered() -> bool:
        for m in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []):
            messages.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
        return len([m for m in messages if m["event"]["job_id"] == job_id]) >= 3

    wait_until(dead_lettered, 40, "three dead-lettered reports")
    ours = [m for m in messages if m["event"]["job_id"] == job_id]
    assert [m["event"]["status"] for m in ours] == ["queued", "running", "succeeded"]
    assert all(m["target"] == "github_status" and m["request"]["body"]["context"] == f"relevo/{project_id}" for m in ours)
    assert all(a["error"] == "ReadTimeoutError" for m in ours for a in m["failure"]["attempts"])
    assert forge.token not in json.dumps(messages) and forge.token not in _log(emulator)
    failed = project_deliveries(local_stack.table_name, project_id, failed_only=True)
    assert {r.event for r in failed if r.outcome.value == "failed"} == {"queued", "running", "ended"}
