"""AWS calls per webhook request kind, counted (issue 29, points 4 and 5): what bench/intake.py
prints, asserted exactly, so that a call added to a path fails `make test` rather than a bench
nobody reads.

Given functions/webhook/handler.py called in this process as Lambda would call it, in the webhook
function's deployed environment, with every AWS API call of the request's thread recorded through
botocore (bench/harness.py ThreadCalls, the recorder bench/intake.py uses), when each kind of
delivery arrives at a warm container, then it makes exactly these calls:

    accepted                     TransactWriteItems (dedup, delivery id, job, the project's lock,
                                 frozen-key check and the delivery's record) + StartExecution
    accepted, project busy       the same TransactWriteItems, cancelled by the lock's condition, then
                                 one with a queue slot instead of the lock + StartExecution
    accepted, project found busy one TransactWriteItems with a queue slot + StartExecution, for
      within the memory          BUSY_PROJECT_MEMORY_SEC after the lock refused one of its jobs
    duplicate, replayed id       the cancelled TransactWriteItems
    ping (ignored)               its record's PutItem
    forged signature, malformed  none, once the project's minute has its record of refusals;
    JSON, body over 1 MiB        the first refusal of a minute makes that record's one PutItem

The refusals' clock is held inside one minute, so the counts do not depend on when the test runs.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bench import harness
from relevo_cli.api import RelevoApi
from relevo_core.intake.busy_projects import busy_projects
from relevo_core.intake.project_cache import project_cache
from relevo_core.intake.webhooks.github import sign
from relevo_core.intake.webhooks.refusals import refusal_minutes
from tests.helpers.payloads import push_body
from tests.helpers.stack import (
    emf_values,
    job_record,
    lock_record,
    metrics_printed,
    register_project,
    table_items,
)

STAGES = [{"name": "build", "run": "true"}]
ACCEPTED = ["dynamodb:TransactWriteItems", "stepfunctions:StartExecution"]
QUEUED = ["dynamodb:TransactWriteItems", *ACCEPTED]
TRANSACTION = ["dynamodb:TransactWriteItems"]
RECORD = ["dynamodb:PutItem"]
OVER_ONE_MIB = b'{"pad": "' + b"x" * (1024 * 1024) + b'"}'


@dataclass
class Container:
    """One warm webhook container: its handler module, the recorder, the project it serves."""

    handler: Any
    calls: harness.ThreadCalls
    project_id: str
    secret: str

    def deliver(
        self, body: bytes, signature: str | None = None, delivery: str | None = None, event: str = "push"
    ) -> tuple[int, list[str]]:
        headers = harness.github_headers(
            self.secret, body, event=event, delivery=delivery, signature=signature
        )
        self.calls.start()
        try:
            response = self.handler.lambda_handler(
                harness.webhook_event(self.project_id, headers, body), harness.LambdaContext()
            )
        finally:
            made, _ = self.calls.stop()
        return int(response["statusCode"]), list(made)

    def push(self, commit: str | None = None, **kwargs: Any) -> tuple[int, list[str]]:
        return self.deliver(push_body(f"acme/{self.project_id}", commit or secrets.token_hex(20)), **kwargs)

    def forged(self) -> tuple[int, list[str]]:
        body = push_body(f"acme/{self.project_id}", secrets.token_hex(20))
        return self.deliver(body, signature=sign("not-the-secret", body))


def _free(stack, project_id: str) -> None:
    """The project's lock let go: the job holding it (a delivery's job: no agent runs it) canceled."""
    for job_id in lock_record(stack, project_id).get("holders") or ():
        RelevoApi.for_stack(stack).cancel_job(job_id)


def _records(stack, project_id: str) -> list[dict[str, Any]]:
    return [item["record"]["M"] for item in table_items(stack, f"DELIVERIES#{project_id}")]


@pytest.fixture()
def minute(monkeypatch: pytest.MonkeyPatch) -> datetime:
    """The refusals' clock, held at the middle of the current minute."""
    now = datetime.now(UTC).replace(second=30, microsecond=0)
    monkeypatch.setattr(refusal_minutes, "clock", lambda: now)
    return now


@pytest.fixture()
def held_monotonic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The container's memories (the project cache, the projects found busy) on a clock that does
    not move: each test's deliveries are warm however long a loaded host takes between them (CI's
    took over PROJECT_CACHE_SEC once, and a refusal re-read the project). What a lapsed memory costs
    is tested with it set to 0."""
    monkeypatch.setattr(project_cache, "clock", lambda: 1000.0)
    monkeypatch.setattr(busy_projects, "clock", lambda: 1000.0)


@pytest.fixture()
def new_container(
    local_stack, project_id, monkeypatch, minute, held_monotonic
) -> Iterator[Callable[..., Container]]:
    """A new webhook container for a newly registered project, in the function's deployed
    environment (plus `environment`); conftest's autouse fixture puts os.environ back after."""
    loaded: list[Container] = []

    def load(**environment: str) -> Container:
        harness.use_function_environment(local_stack, "WebhookFunction")
        metrics_printed(monkeypatch)
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        secret = register_project(local_stack, project_id, STAGES)
        handler = harness.cold_handler("webhook")  # nothing cached
        loaded.append(Container(handler, harness.ThreadCalls().install(), project_id, secret))
        return loaded[-1]

    yield load
    for container in loaded:
        container.calls.uninstall()
    harness.cold_handler("webhook")  # leave no cached settings of this test behind


@pytest.fixture()
def container(new_container) -> Container:
    """A warm container: its first delivery (cold: project, secret and queue URL read) is done."""
    warm = new_container()
    status, made = warm.push()
    assert status == 202, made
    return warm


def test_a_cold_accepted_delivery_reads_the_project_secret_and_queue_then_writes_once_and_starts(
    new_container,
):
    status, made = new_container().push()
    assert status == 202
    assert made == ["dynamodb:GetItem", "secretsmanager:GetSecretValue", "sqs:GetQueueUrl", *ACCEPTED], (
        f"{len(made)} calls"
    )


def _job_statuses(stack, container: Container) -> list[str]:
    """The statuses of the jobs the container's accepted deliveries made, in delivery order."""
    records = sorted(_records(stack, container.project_id), key=lambda r: r["at"]["S"])
    return [job_record(stack, r["job_id"]["S"])["status"] for r in records if r["outcome"]["S"] == "accepted"]


def test_a_warm_accepted_delivery_takes_two_calls(container, local_stack):
    """The delivery's record rides in the job's transaction: no PutItem of its own; so does the
    project's lock, when it is free. While a job holds it, the next is queued in a second
    transaction: one call more; and the container, now knowing the project busy, writes the jobs
    after it queued in one (intake.busy_projects)."""
    _free(local_stack, container.project_id)
    statuses, made = zip(*(container.push() for _ in range(4)), strict=True)
    assert statuses == (202, 202, 202, 202)
    assert list(made) == [ACCEPTED, QUEUED, ACCEPTED, ACCEPTED], [len(calls) for calls in made]
    accepted = [r for r in _records(local_stack, container.project_id) if r["outcome"]["S"] == "accepted"]
    assert len(accepted) == 5 and all("job_id" in r for r in accepted)  # the cold one and these four
    assert _job_statuses(local_stack, container)[1:] == ["running", "queued", "queued", "queued"]


def test_with_no_memory_of_a_busy_project_each_of_its_jobs_tries_the_lock(new_container, local_stack):
    warm = new_container(BUSY_PROJECT_MEMORY_SEC="0")
    assert warm.push()[0] == 202  # cold: it takes the lock
    statuses, made = zip(*(warm.push() for _ in range(3)), strict=True)
    assert statuses == (202, 202, 202)
    assert list(made) == [QUEUED, QUEUED, QUEUED], [len(calls) for calls in made]


def test_an_accepted_delivery_after_the_project_cache_expired_rereads_the_project(new_container, local_stack):
    expired = new_container(PROJECT_CACHE_SEC="0")
    expired.push()
    _free(local_stack, expired.project_id)
    status, made = expired.push()
    assert (status, made) == (202, ["dynamodb:GetItem", *ACCEPTED]), f"{len(made)} calls"


def test_a_duplicate_takes_one_call_and_stores_nothing(container, local_stack):
    commit = secrets.token_hex(20)
    assert container.push(commit)[0] == 202
    before = _records(local_stack, container.project_id)

    status, made = container.push(commit)  # the same push, a new delivery id

    assert (status, made) == (200, TRANSACTION), f"{len(made)} calls"
    assert _records(local_stack, container.project_id) == before


def test_a_replayed_delivery_id_takes_one_call(container):
    delivery = str(uuid.uuid4())
    commit = secrets.token_hex(20)
    assert container.push(commit, delivery=delivery)[0] == 202

    status, made = container.push(commit, delivery=delivery)

    assert (status, made) == (200, TRANSACTION), f"{len(made)} calls"


def test_a_ping_takes_its_record_only(container):
    status, made = container.deliver(b'{"zen": "Design for failure."}', event="ping")
    assert (status, made) == (200, RECORD), f"{len(made)} calls"


@pytest.mark.parametrize(
    "kind",
    ["forged signature", "malformed JSON", "body over 1 MiB"],
)
def test_a_refused_delivery_makes_no_call_once_the_minute_is_recorded(container, kind):
    """Given the project's refusal of this minute already recorded, any further refusal of the
    minute, whatever it is, writes nothing and reads nothing."""
    assert container.forged() == (401, RECORD)

    if kind == "forged signature":
        answer = container.forged()
    elif kind == "malformed JSON":
        answer = container.deliver(b'{"ref": "refs/heads/main", ')
    else:
        answer = container.deliver(OVER_ONE_MIB)

    assert answer == ({"forged signature": 401, "malformed JSON": 400, "body over 1 MiB": 413}[kind], []), (
        f"{len(answer[1])} calls"
    )


def test_refusals_store_one_record_per_project_and_minute(
    container, local_stack, minute, monkeypatch, capsys, caplog
):
    """A flood of refusals: the minute's first makes one conditional PutItem, the rest none, and
    each is counted (WebhookRefused, in all and by reason); the next minute gets one record again;
    a second container's write of a recorded minute is refused by DynamoDB
    (ConditionalCheckFailedException) and stores nothing."""
    capsys.readouterr()
    caplog.clear()
    answers = [container.forged(), container.deliver(b"{not json"), container.deliver(OVER_ONE_MIB)] + [
        container.forged() for _ in range(5)
    ]
    assert [made for _, made in answers] == [RECORD] + [[]] * 7
    assert [status for status, _ in answers] == [401, 400, 413] + [401] * 5
    printed = capsys.readouterr().out
    assert sum(emf_values(printed)["WebhookRefused"]) == 2 * 8  # each in all, and by reason
    reasons = [
        json.loads(line)["Reason"] for line in printed.splitlines() if '"Reason"' in line and '"_aws"' in line
    ]
    assert sorted(reasons) == sorted(["SIGNATURE_INVALID"] * 6 + ["MALFORMED_JSON", "PAYLOAD_TOO_LARGE"])
    warned = [r for r in caplog.records if r.getMessage() == "webhook delivery refused"]
    assert [(r.levelname, r.reason, r.http_status) for r in warned[:3]] == [
        ("WARNING", "SIGNATURE_INVALID", 401),
        ("WARNING", "MALFORMED_JSON", 400),
        ("WARNING", "PAYLOAD_TOO_LARGE", 413),
    ]
    assert len(warned) == 8 and {r.project for r in warned} == {container.project_id}
    logged = printed + "".join(str(vars(r)) for r in caplog.records)
    assert (
        container.secret not in logged and "not json" not in logged and "xxxx" not in logged
    )  # no body, no secret

    later = minute + timedelta(minutes=1)
    monkeypatch.setattr(refusal_minutes, "clock", lambda: later)
    assert container.forged() == (401, RECORD)
    assert container.forged() == (401, [])

    refusal_minutes.clear()  # a second container: it does not know the minute is recorded
    assert container.forged() == (401, RECORD)  # the condition refuses it

    refused = [r for r in _records(local_stack, container.project_id) if r["outcome"]["S"] == "refused"]
    assert sorted(r["reason"]["S"] for r in refused) == ["SIGNATURE_INVALID", "SIGNATURE_INVALID"]
    assert sorted(r["at"]["S"][:16] for r in refused) == [minute.isoformat()[:16], later.isoformat()[:16]]
