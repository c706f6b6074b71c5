"""Commit statuses on the local stack: real jobs (webhook, state machine, stage reports), the
table's stream delivered to StatusReporterFunction as the template declares it, and a local
recorder standing in for GitHub and GitLab. Every GitHub call is checked against GitHub's
published REST description (local/relevo_local/github/openapi.py)."""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts
from relevo_core.store.codec import envelope_of, pack_envelope
from relevo_core.store.deliveries import project_deliveries
from relevo_core.store.job_stages import stage_records
from relevo_local.github.openapi import check_call
from tests.helpers.payloads import push_body
from tests.helpers.stack import (
    deliver,
    job_execution_arn,
    job_record,
    job_stream_records,
    receive_stage,
    register_project,
    stream_captured,
    table_items,
    wait_for_execution,
    wait_until,
)
from tests.helpers.state_machine import agent_runs, claim_and_accept, wait_for_run_token

BUILD = [{"name": "build", "run": "make"}]
GATED = [{"name": "build", "run": "make"}, {"name": "deploy", "run": "fastlane deliver"}]


@pytest.fixture()
def forge(local_stack, project_id, recorder):
    """Registers the test's project reporting to the recorder; `start()` pushes a commit."""
    token = "tok_" + secrets.token_hex(16)
    token_ref = f"relevo/{local_stack.stack_name}/_status/{project_id}"
    client("secretsmanager").create_secret(Name=token_ref, SecretString=token)

    class Forge:
        def __init__(self) -> None:
            self.token = token
            self.commit = secrets.token_hex(20)

        def register(self, stages=BUILD, provider="github", **extra) -> None:
            self.secret = register_project(
                local_stack,
                project_id,
                stages,
                commit_status={
                    "provider": provider,
                    "token_ref": token_ref,
                    "api_url": recorder.url + ("/api/v4" if provider == "gitlab" else ""),
                },
                **extra,
            )

        def push(self) -> str:
            response = deliver(
                local_stack, project_id, push_body(f"acme/{project_id}", self.commit), self.secret
            )
            assert response.status_code == 202, response.text
            return response.json()["job_id"]

        def statuses(self, count: int, timeout: float = 20) -> list:
            return wait_until(
                lambda: (found := recorder.received(self.commit)) and len(found) >= count and found,
                timeout,
                f"{count} statuses for {self.commit}",
            )

    return Forge()


def _run_all(stack, job_id, stages: int) -> None:
    for _ in range(stages):
        task, _ = receive_stage(stack, job_id)
        agent_runs(stack, task)


def _log(emulator) -> str:
    path = emulator.state_dir / "logs" / "StatusReporterFunction.log"
    return path.read_text() if path.exists() else ""


def test_each_transition_is_one_github_status_and_a_repeated_record_sends_nothing(
    local_stack, emulator, project_id, forge, recorder
):
    with stream_captured(local_stack) as batches:
        forge.register(GATED, approval={"enabled": True})
        job_id = forge.push()
        _run_all(local_stack, job_id, 1)
        wait_until(lambda: job_record(local_stack, job_id).get("status") == "waiting", 15, "the gate")
        RelevoApi.for_stack(local_stack).approve(job_id, "ship it")
        _run_all(local_stack, job_id, 1)
        assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
        sent = forge.statuses(4)

    # The job took its project's free lock at intake: written running, it never queued.
    bodies = [r.json() for r in sent]
    assert [(b["state"], b["description"]) for b in bodies] == [
        ("pending", "running"),
        ("pending", f"waiting for approval of deploy: relevo job approve {job_id}"),
        ("pending", "running"),
        ("success", "succeeded"),
    ]
    for request in sent:
        assert (
            check_call(request.method, urlsplit(request.path).path, request.json())
            == "repos/create-commit-status"
        )
        assert request.path == f"/repos/acme/{project_id}/statuses/{forge.commit}"
        assert request.headers["authorization"] == f"Bearer {forge.token}"
    assert {b["context"] for b in bodies} == {f"relevo/{project_id}"}
    assert bodies[0]["target_url"].endswith(
        f"#/v2/executions/details/{job_execution_arn(local_stack, job_id)}"
    )

    records = [
        r for r in project_deliveries(local_stack.table_name, project_id) if r.direction.value == "outgoing"
    ]
    assert sorted((r.target, r.event, r.outcome.value, r.http_status, r.attempt) for r in records) == sorted(
        [("github_status", e, "delivered", 201, 1) for e in ("running", "waiting", "running", "ended")]
    )
    # Each with the latency of its attempt, and a TTL of its own: the function's delivery record
    # days after the attempt (not the job's retention).
    assert all(r.latency_ms is not None and 0 <= r.latency_ms < 10_000 for r in records)
    from relevo_core.config.notify import NotifySettings

    deployed = client("lambda").get_function_configuration(
        FunctionName=local_stack.resources["StatusReporterFunction"]
    )
    days = int(
        deployed["Environment"]["Variables"].get(
            "DELIVERY_RECORD_DAYS", NotifySettings.model_fields["delivery_record_days"].default
        )
    )
    for item in table_items(local_stack, f"DELIVERIES#{project_id}"):
        at = datetime.fromisoformat(item["record"]["M"]["at"]["S"]).timestamp()
        assert int(item["ttl"]["N"]) - at == pytest.approx(days * 86_400, abs=2)

    # The same stream records again (a redelivery by the event source mapping): nothing is sent.
    ours = job_stream_records(batches, job_id)
    assert len(ours) >= 5
    response = emulator._runtimes["StatusReporterFunction"].invoke({"Records": ours})
    assert response == {"batchItemFailures": []}
    time.sleep(0.5)
    assert len(recorder.received(forge.commit)) == 4

    # The token is nowhere but in the Authorization header it was sent in.
    stored = json.dumps(
        table_items(local_stack, "DELIVERIES#") + table_items(local_stack, "NOTICES#"), default=str
    )
    assert forge.token not in stored and forge.token not in _log(emulator)


def test_500s_and_429s_are_retried_and_no_transition_is_lost(local_stack, project_id, forge, recorder):
    forge.register()
    recorder.answer(500)
    recorder.answer(429, headers={"Retry-After": "1"})
    recorder.answer(503)
    job_id = forge.push()
    _run_all(local_stack, job_id, 1)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

    sent = forge.statuses(5)  # 2 transitions, the first one after 3 failed attempts
    assert [(r.json()["state"], r.json()["description"]) for r in sent] == [("pending", "running")] * 4 + [
        ("success", "succeeded"),
    ]

    # Each delivery is recorded once its answer came back, a moment after the forge answered it.
    def outgoing() -> list[tuple[str, int, int, str]] | None:
        found = sorted(
            (r.event, r.attempt, r.http_status, r.outcome.value)
            for r in project_deliveries(local_stack.table_name, project_id)
            if r.direction.value == "outgoing"
        )
        return found if len(found) >= 5 else None

    attempts = wait_until(outgoing, 15, "five delivery records")
    assert attempts == [
        ("ended", 1, 201, "delivered"),
        ("running", 1, 500, "retrying"),
        ("running", 2, 429, "retrying"),
        ("running", 3, 503, "retrying"),
        ("running", 4, 201, "delivered"),
    ]
    # The 429's Retry-After was honoured: its retry came a second or more after it.
    assert sent[2].at - sent[1].at >= 1.0


def test_gitlab_gets_its_commit_status_with_the_project_access_token(
    local_stack, project_id, forge, recorder
):
    forge.register(provider="gitlab")
    job_id = forge.push()
    _run_all(local_stack, job_id, 1)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    sent = forge.statuses(2)
    assert [r.json()["state"] for r in sent] == ["running", "success"]
    assert {r.path for r in sent} == {f"/api/v4/projects/acme%2F{project_id}/statuses/{forge.commit}"}
    assert {r.headers["private-token"] for r in sent} == {forge.token}
    assert {r.json()["name"] for r in sent} == {f"relevo/{project_id}"} and {
        r.json()["ref"] for r in sent
    } == {"main"}


def test_a_hung_forge_never_delays_the_job_and_every_report_is_dead_lettered(
    local_stack, emulator, project_id, forge, recorder
):
    forge.register(GATED[:1] + [{"name": "sign", "run": "codesign"}])

    def one_job() -> tuple[str, float]:
        forge.commit = secrets.token_hex(20)
        started = time.monotonic()
        job_id = forge.push()
        _run_all(local_stack, job_id, 2)
        assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
        return job_id, time.monotonic() - started

    _, healthy = one_job()
    forge.statuses(2)  # the healthy job's reports are all sent before the forge hangs
    recorder.hang_always(60)
    job_id, hung = one_job()
    # The same job beside a forge that never answers: its two reports take 10 s each
    # (StatusSendBudgetSeconds in tests/conftest.py), and none of that is the job's time.
    assert hung < healthy + 3, (
        f"the job took {hung:.1f} s beside a hung forge, {healthy:.1f} s beside a healthy one"
    )

    # The queue is the stack's, shared with this worker's other tests; some of what lands there
    # (agents_offline, key_frozen) names no job, so only this job's messages are read and deleted.
    ours = _dead_letters(local_stack, job_id, 2, within=60)
    assert [m["event"]["status"] for m in ours] == ["running", "succeeded"]
    assert all(
        m["target"] == "github_status" and m["request"]["body"]["context"] == f"relevo/{project_id}"
        for m in ours
    )
    assert all(a["error"] == "ReadTimeoutError" for m in ours for a in m["failure"]["attempts"])
    assert forge.token not in json.dumps(ours) and forge.token not in _log(emulator)
    failed = project_deliveries(local_stack.table_name, project_id, failed_only=True)
    assert {r.event for r in failed if r.outcome.value == "failed" and r.direction.value == "outgoing"} == {
        "running",
        "ended",
    }


def test_github_app_mode_creates_one_check_run_and_updates_it_with_a_summary_per_stage(
    local_stack, project_id, recorder
):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    key_ref = f"relevo/{local_stack.stack_name}/_status/{project_id}-app-key"
    client("secretsmanager").create_secret(Name=key_ref, SecretString=pem)
    recorder.route(
        "POST",
        "/access_tokens",
        201,
        {"token": "ghs_" + secrets.token_hex(8), "expires_at": "2999-01-01T00:00:00Z"},
    )
    recorder.route("POST", "/check-runs", 201, {"id": 4242})
    recorder.route("PATCH", "/check-runs/4242", 200, {"id": 4242})
    secret = register_project(
        local_stack,
        project_id,
        [{"name": "build", "run": "make"}, {"name": "sign", "run": "codesign"}],
        commit_status={
            "provider": "github",
            "api_url": recorder.url,
            "app": {"app_id": 77, "installation_id": 5, "private_key_ref": key_ref},
        },
    )
    commit = secrets.token_hex(20)
    response = deliver(local_stack, project_id, push_body(f"acme/{project_id}", commit), secret)
    job_id = response.json()["job_id"]

    def summary_saying(text: str) -> dict:
        """A stage's own update (only the output: the run's status and conclusion are the job's
        reports' to set) whose summary says `text`."""
        return wait_until(
            lambda: next(
                (
                    b
                    for r in recorder.received("/check-runs")
                    if set(b := r.json()) == {"output"} and text in b["output"]["summary"]
                ),
                None,
            ),
            20,
            f"a stage's check run update with {text!r}",
        )

    # The summary follows each stage as it starts and ends, not only the job's transitions.
    task, _ = receive_stage(local_stack, job_id)
    ref = claim_and_accept(local_stack, task, "double-1")
    started = summary_saying("| build | running |")
    assert "| sign | pending |" in started["output"]["summary"]
    run_token = wait_for_run_token(ref)
    # The build took 1.1 s by the agent's clock: its end is recorded 1.1 s after its start.
    began = datetime.fromisoformat(stage_records(local_stack.table_name, job_id)[0]["started_at"])
    stage_attempts.finish(ref, StageStatus.SUCCEEDED, began + timedelta(seconds=1.1), 0, None)
    client("stepfunctions").send_task_success(
        taskToken=run_token, output=json.dumps({"agent_id": "double-1"})
    )
    ended = summary_saying("| build | succeeded |")["output"]["summary"]
    [build_row] = [line for line in ended.splitlines() if line.startswith("| build |")]
    record = stage_records(local_stack.table_name, job_id)[0]
    took = datetime.fromisoformat(record["ended_at"]) - datetime.fromisoformat(record["started_at"])
    assert took.total_seconds() >= 1.1
    assert build_row == f"| build | succeeded | {took.total_seconds():.1f} s | 1 |  |"
    _run_all(local_stack, job_id, 1)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

    runs = wait_until(
        lambda: (r := recorder.received("/check-runs"))
        and len(r) >= 3
        and r[-1].json().get("status") == "completed"
        and r,
        20,
        "the check run's completion",
    )
    tokens = recorder.received("/access_tokens")
    assert len(tokens) == 1  # one installation token, reused
    assert [(r.method, r.path) for r in runs] == [("POST", f"/repos/acme/{project_id}/check-runs")] + [
        ("PATCH", f"/repos/acme/{project_id}/check-runs/4242")
    ] * (len(runs) - 1)
    for request in tokens + runs:
        check_call(request.method, urlsplit(request.path).path, request.json())
    first, last = runs[0].json(), runs[-1].json()
    assert (first["name"], first["head_sha"], first["external_id"], first["status"]) == (
        f"relevo/{project_id}",
        commit,
        job_id,
        "in_progress",  # the job runs from its first report: intake took its project's free lock
    )
    assert (last["status"], last["conclusion"]) == ("completed", "success")
    assert (
        "| build | succeeded |" in last["output"]["summary"]
        and "| sign | succeeded |" in last["output"]["summary"]
    )
    assert pem.splitlines()[1] not in json.dumps(
        table_items(local_stack, "DELIVERIES#") + table_items(local_stack, "NOTICES#"), default=str
    )


def _dead_letters(stack, job_id: str, count: int, within: float = 30) -> list[dict]:
    """This job's messages on StatusDeadLetterQueue (others' are left for their own tests)."""
    sqs = client("sqs")
    queue = stack.resources["StatusDeadLetterQueue"]
    queue_url = queue if queue.startswith("http") else sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    found: list[dict] = []

    def read() -> bool:
        for m in sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=1
        ).get("Messages", []):
            body = json.loads(m["Body"])
            if (body.get("event") or {}).get("job_id") == job_id:
                found.append(body)
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
        return len(found) >= count

    wait_until(read, within, f"{count} dead-lettered reports of {job_id}")
    return found


def test_a_dead_lettered_pending_replayed_after_success_is_superseded_not_sent(
    local_stack, emulator, project_id, forge, recorder
):
    forge.register()
    recorder.answer(500, times=4)  # every attempt of the first report (SEND_ATTEMPTS): dead-lettered
    job_id = forge.push()
    _run_all(local_stack, job_id, 1)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    sent = forge.statuses(5)
    assert [r.json()["description"] for r in sent] == ["running"] * 4 + ["succeeded"]
    [pending] = _dead_letters(local_stack, job_id, 1)
    assert pending["event"]["status"] == "running" and pending["target"] == "github_status"

    # Replayed by hand once the job succeeded and its success was on the commit.
    response = emulator._runtimes["StatusReporterFunction"].invoke({"replay": [pending]})
    assert response == {"replayed": ["superseded"]}
    time.sleep(0.5)
    assert len(recorder.received(forge.commit)) == 5  # the commit still says success
    records = [
        r for r in project_deliveries(local_stack.table_name, project_id) if r.direction.value == "outgoing"
    ]
    assert [(r.event, r.outcome.value) for r in records if r.outcome.value == "superseded"] == [
        ("running", "superseded")
    ]


def test_a_stale_report_never_overwrites_a_newer_one_on_the_commit(
    local_stack, emulator, project_id, forge, recorder
):
    """The job's mark per target: a report of the job's status now (running), but written before
    the newer running that was already delivered, is superseded too."""
    forge.register(GATED, approval={"enabled": True})
    job_id = forge.push()
    forge.statuses(1)  # running (intake took the project's free lock: it never queued)
    recorder.answer(500, times=4)  # the next report, the gate's: dead-lettered
    _run_all(local_stack, job_id, 1)
    wait_until(lambda: job_record(local_stack, job_id).get("status") == "waiting", 15, "the gate")
    [waiting] = _dead_letters(local_stack, job_id, 1)
    RelevoApi.for_stack(local_stack).approve(job_id, "ship it")
    wait_until(
        lambda: job_record(local_stack, job_id).get("status") == "running", 15, "the run after the gate"
    )
    sent = forge.statuses(6)  # running, the gate's 4 failed attempts, running
    assert [r.json()["description"] for r in sent][-1] == "running"
    # The first running (before the gate), as if it had been dead-lettered and were replayed now.
    first_running = dict(
        waiting,
        event={
            **waiting["event"],
            "status": "running",
            "previous": None,
            "gate": None,
            "transition": "running#earlier",
            "at": waiting["event"]["at"] - 1,
        },
    )
    runtime = emulator._runtimes["StatusReporterFunction"]
    assert runtime.invoke({"replay": [first_running, waiting]}) == {"replayed": ["superseded", "superseded"]}
    time.sleep(0.5)
    assert [r.json()["description"] for r in recorder.received(forge.commit)][-1] == "running"
    _run_all(local_stack, job_id, 1)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"


def test_a_report_whose_invocation_fails_after_its_claim_is_sent_by_the_streams_next_delivery(
    local_stack, forge, recorder, monkeypatch
):
    """A DynamoDB error between a report's claim and its send (here: reading the newest report
    sent for the job) fails the stream record, which the stream delivers again within seconds.
    The claim used to stand until it expired, so that delivery found it taken, counted the record
    as done and the status was never sent. It is given back now: the next delivery sends it once."""
    from botocore.exceptions import ClientError

    import relevo_core.notify.reporter as reporter_module
    from relevo_core.config.notify import NotifySettings
    from relevo_core.notify.reporter import Reporter
    from relevo_core.notify.sending import Clock, Urllib3Transport
    from relevo_core.store.projects import get_project

    forge.register()
    real = job_record(local_stack, forge.push())
    # The same job seen by another change: a job and commit of its own, so nothing else reports them.
    commit = secrets.token_hex(20)
    job_id = "job_" + secrets.token_hex(13)
    new = {
        **real,
        "pk": f"JOB#{job_id}",
        "job_id": job_id,
        "status": "running",
        "updated_at": datetime.now(UTC).isoformat(),
        "packed_envelope": pack_envelope({**envelope_of(real), "job_id": job_id, "commit": commit}),
    }
    old = {
        **new,
        "status": "queued",
    }  # the images as the stream gives them (notify.transitions.stream_images)
    settings = NotifySettings.model_validate(
        {
            "TABLE_NAME": local_stack.table_name,
            "STATE_MACHINE_ARN": local_stack.state_machine_arn,
            "QUEUED_STATE_MACHINE_ARN": local_stack.queued_state_machine_arn,
            "STATUS_DEAD_LETTER_QUEUE_URL": local_stack.resources["StatusDeadLetterQueue"],
            "GROUP_TOPIC_ARN": local_stack.resources["GroupTopic"],
            "HTTP_READ_TIMEOUT_SEC": "2",
        }
    )
    reporter = Reporter(
        settings,
        Urllib3Transport(),
        Clock(),
        project=lambda p: get_project(local_stack.table_name, p),
        secret=lambda name: client("secretsmanager").get_secret_value(SecretId=name)["SecretString"],
    )
    real_read = reporter_module.latest_reported_at
    failures = iter(
        [
            ClientError(
                {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}},
                "GetItem",
            )
        ]
    )

    def read_once_throttled(*args, **kwargs):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real_read(*args, **kwargs)

    monkeypatch.setattr(reporter_module, "latest_reported_at", read_once_throttled)
    with pytest.raises(ClientError):
        reporter.report_change(old, new, deadline=time.time() + 30)
    assert not [i for i in table_items(local_stack, f"NOTICES#{job_id}")], "the claim was left standing"

    reporter.report_change(old, new, deadline=time.time() + 30)  # the stream's next delivery

    [sent] = wait_until(lambda: recorder.received(commit), 10, "the status")
    assert sent.json()["state"] == "pending"
    reporter.report_change(old, new, deadline=time.time() + 30)  # and a third delivery sends nothing more
    assert len(recorder.received(commit)) == 1
