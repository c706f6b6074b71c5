"""The job's one transaction, with the webhook delivery's record in it (issue 29), against what
DynamoDB takes and answers.

AWS ("TransactWriteItems", DynamoDB API Reference): up to 100 actions, no two on the same item,
4 MB for the items in all (an item at most 400 KB); the whole transaction or nothing. A refused
condition cancels it with TransactionCanceledException, whose CancellationReasons hold one reason
per action in request order, the refused item with it under ReturnValuesOnConditionCheckFailure
ALL_OLD. ClientRequestToken makes the call idempotent for 10 minutes; botocore fills it in (an
idempotency token in DynamoDB's service model).

Given the largest envelope intake can write (relevo_core.plan_limits) and a delivery's record,
when store.job_creation.create_job sends its transaction through a real botocore client that answers in
AWS's shapes before anything leaves the process, then the request stays within those limits, is
sent once with a client token, and each cancellation reads as the answer it is.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from relevo_core.intake.webhooks.incoming import IncomingDelivery
from relevo_core.intake.webhooks.records import incoming_record
from relevo_core.models.delivery import Outcome
from relevo_core.models.project import Project
from relevo_core.plan_limits import (
    MAX_COMMAND_BYTES,
    MAX_ENVELOPE_BYTES,
    MAX_STAGES,
    envelope_bytes,
    largest_envelope,
)
from relevo_core.store import job_creation
from relevo_core.store.deliveries import delivery_put

TABLE = "relevo-Table"
NOW = datetime(2026, 12, 1, 10, 15, 30, tzinfo=UTC)
MAX_ACTIONS = 100
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024
MAX_ITEM_BYTES = 400 * 1024


def _largest_envelope():
    """32 stages with the longest names, commands as long as they come until the envelope is just
    over MAX_ENVELOPE_BYTES: larger than any intake writes (require_envelope_fits), an upper bound."""
    names = [f"s{index:02d}" + "x" * 60 for index in range(MAX_STAGES)]
    stages = [{"name": name, "run": "x"} for name in names]

    def envelope():
        project = Project.model_validate(
            {"id": "p" * 63, "repo": "acme/app", "region_affinity": "r" * 32, "stages": stages}
        )
        return largest_envelope(project)

    for stage in stages:
        short = envelope_bytes(envelope())
        if short > MAX_ENVELOPE_BYTES:
            break
        stage["run"] = "c" * min(MAX_COMMAND_BYTES, MAX_ENVELOPE_BYTES - short + 2)
    largest = envelope()
    assert MAX_ENVELOPE_BYTES < envelope_bytes(largest) < MAX_ENVELOPE_BYTES + MAX_COMMAND_BYTES
    return largest


def _record_put() -> dict[str, Any]:
    delivery = IncomingDelivery("github", "p" * 63, "e" * 64, "d" * 128, 1024 * 1024)
    record = incoming_record(delivery, Outcome.ACCEPTED, 202, "held", NOW, job_id="job_" + "0" * 40)
    return delivery_put(TABLE, record, ttl=10**11 - 1)


class Dynamo:
    """A real botocore DynamoDB client whose TransactWriteItems is answered here, in AWS's shapes."""

    def __init__(
        self,
        answer: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]],
        job_record: dict[str, Any] | None = None,
    ) -> None:
        self.sent: list[dict[str, Any]] = []
        self.read: list[dict[str, Any]] = []
        self.client = boto3.client(
            "dynamodb", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
        )

        def get_item(params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
            self.read.append(json.loads(params["body"]))

            class Http:
                status_code = 200
                headers: dict[str, str] = {}

            return Http(), {"Item": job_record} if job_record is not None else {}

        self.client.meta.events.register("before-call.dynamodb.GetItem", get_item)

        def before_call(params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
            body = json.loads(params["body"])
            self.sent.append(body)
            status, parsed = answer(body)

            class Http:
                status_code = status
                headers: dict[str, str] = {}

            return Http(), parsed

        self.client.meta.events.register("before-call.dynamodb.TransactWriteItems", before_call)


def _create(
    monkeypatch: pytest.MonkeyPatch, dynamo: Dynamo, envelope: Any, queue_first: bool = False
) -> job_creation.CreateOutcome:
    monkeypatch.setattr(job_creation, "client", lambda service: dynamo.client)
    return job_creation.create_job(
        TABLE,
        envelope,
        86_400,
        50,
        NOW,
        refuse_frozen=True,
        also_write=[_record_put()],
        queue_first=queue_first,
    )


def _cancelled(reasons: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    return 400, {
        "Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"},
        "CancellationReasons": reasons,
    }


def test_the_largest_job_transaction_is_within_what_dynamodb_takes(monkeypatch):
    dynamo = Dynamo(lambda body: (200, {}))
    envelope = _largest_envelope()

    assert _create(monkeypatch, dynamo, envelope) == job_creation.Created(envelope.job_id, took_lock=True)

    [request] = dynamo.sent
    actions = request["TransactItems"]
    # dedup, delivery id, job, its slot (the project's lock), frozen check, the record
    assert len(actions) == 6 <= MAX_ACTIONS
    keys = [
        json.dumps(
            next(iter(action.values())).get("Key")
            or {k: v for k, v in next(iter(action.values()))["Item"].items() if k in ("pk", "sk")},
            sort_keys=True,
        )
        for action in actions
    ]
    assert len(set(keys)) == len(keys)  # no two actions on one item
    # JSON of an item is longer than DynamoDB's count of it (names and values): an upper bound.
    sizes = [len(json.dumps(next(iter(action.values())).get("Item", {}))) for action in actions]
    assert max(sizes) < MAX_ITEM_BYTES and sum(sizes) < MAX_TRANSACTION_BYTES
    record = actions[-1]["Put"]
    assert record["Item"]["pk"] == {"S": "DELIVERIES#" + "p" * 63} and "ConditionExpression" not in record


def test_the_transaction_goes_out_once_with_a_client_request_token(monkeypatch):
    dynamo = Dynamo(lambda body: (200, {}))
    _create(monkeypatch, dynamo, _largest_envelope())
    [request] = dynamo.sent
    assert len(request["ClientRequestToken"]) == 36  # a UUID botocore made; its retries send the same


def test_a_duplicate_cancels_the_transaction_record_and_all(monkeypatch):
    """The dedup record's condition refuses: one call, nothing of it written, the existing job named."""
    dynamo = Dynamo(
        lambda body: _cancelled(
            [
                {
                    "Code": "ConditionalCheckFailed",
                    "Item": {"job_id": {"S": "job_earlier"}, "expires_at": {"N": str(10**10)}},
                }
            ]
            + [{"Code": "None"}] * (len(body["TransactItems"]) - 1)
        )
    )
    assert _create(monkeypatch, dynamo, _largest_envelope()) == job_creation.Duplicate(
        "job_earlier", "idempotency_key"
    )
    assert len(dynamo.sent) == 1


def test_a_replayed_delivery_id_cancels_it_too(monkeypatch):
    dynamo = Dynamo(
        lambda body: _cancelled(
            [{"Code": "None"}, {"Code": "ConditionalCheckFailed", "Item": {"job_id": {"S": "job_earlier"}}}]
            + [{"Code": "None"}] * (len(body["TransactItems"]) - 2)
        )
    )
    assert _create(monkeypatch, dynamo, _largest_envelope()) == job_creation.Duplicate(
        "job_earlier", "delivery"
    )
    assert len(dynamo.sent) == 1


@pytest.mark.parametrize("record, took_lock", [({"machine": {"S": "run"}}, True), ({}, False)])
def test_our_own_write_met_again_is_the_job_created(monkeypatch, record, took_lock):
    """A repeat of a transaction that did commit (a retry after its answer was lost, beyond the
    token's 10 minutes) is cancelled by its own dedup record: it reads as created, and writes no
    second record; whether it took the project's lock, its record says (one consistent read)."""
    envelope = _largest_envelope()
    dynamo = Dynamo(
        lambda body: _cancelled(
            [
                {
                    "Code": "ConditionalCheckFailed",
                    "Item": {"job_id": {"S": envelope.job_id}, "expires_at": {"N": str(10**10)}},
                }
            ]
            + [{"Code": "None"}] * (len(body["TransactItems"]) - 1)
        ),
        job_record=record,
    )
    assert _create(monkeypatch, dynamo, envelope) == job_creation.Created(
        envelope.job_id, took_lock=took_lock
    )
    assert len(dynamo.sent) == 1
    [read] = dynamo.read
    assert read["ConsistentRead"] is True and read["Key"]["pk"] == {"S": f"JOB#{envelope.job_id}"}


def _action(request: dict[str, Any], prefix: str) -> tuple[str, dict[str, Any]]:
    """The action of `request` on the item whose partition key starts with `prefix`."""
    for action in request["TransactItems"]:
        ((kind, body),) = action.items()
        if (body.get("Key") or body.get("Item"))["pk"]["S"].startswith(prefix):
            return kind, body
    raise AssertionError(f"no action on {prefix}")


def test_a_free_project_lock_is_taken_with_the_job_which_is_written_running(monkeypatch):
    """The job's slot is its project's lock, taken only while it has room and nobody waits (the
    state machine's own first try): the job is written running, marked for the common machine,
    and takes no queue slot."""
    dynamo = Dynamo(lambda body: (200, {}))
    envelope = _largest_envelope()
    assert _create(monkeypatch, dynamo, envelope) == job_creation.Created(envelope.job_id, took_lock=True)
    [request] = dynamo.sent
    kind, lock = _action(request, "LOCK#")
    assert kind == "Update" and lock["Key"]["pk"] == {"S": f"LOCK#{envelope.project}"}
    assert "attribute_not_exists(waiters)" in lock["ConditionExpression"]
    assert "NOT contains(holders, :name)" in lock["ConditionExpression"]
    assert lock["ExpressionAttributeValues"][":me"] == {"SS": [envelope.job_id]}
    _, job = _action(request, "JOB#")
    assert (job["Item"]["status"], job["Item"]["machine"]) == ({"S": "running"}, {"S": "run"})
    # No sweeper marker: the sweeper finds it through the lock should its execution never start.
    assert "start_pending" not in job["Item"]
    assert not any(
        (next(iter(a.values())).get("Key") or {}).get("pk") == {"S": "COUNTER#queued"}
        for a in request["TransactItems"]
    )


def test_a_lock_taken_or_waited_for_queues_the_job_in_a_second_transaction(monkeypatch):
    """The lock's refusal alone: the job is written queued with a queue slot instead, in one more
    call, and the lock is not touched by it."""
    dynamo = Dynamo(
        lambda body: (200, {})
        if len(dynamo.sent) > 1
        else _cancelled(
            [{"Code": "None"}] * 3 + [{"Code": "ConditionalCheckFailed"}] + [{"Code": "None"}] * 2
        )
    )
    envelope = _largest_envelope()
    assert _create(monkeypatch, dynamo, envelope) == job_creation.Created(
        envelope.job_id, took_lock=False, found_lock_taken=True
    )
    first, second = dynamo.sent
    assert _action(first, "LOCK#")[0] == "Update"
    with pytest.raises(AssertionError):
        _action(second, "LOCK#")
    _, job = _action(second, "JOB#")
    assert job["Item"]["status"] == {"S": "queued"} and "machine" not in job["Item"]
    kind, counter = _action(second, "COUNTER#queued")
    assert (
        kind == "Update"
        and counter["ConditionExpression"] == "attribute_not_exists(queued) OR queued < :limit"
    )
    assert len(second["TransactItems"]) == len(first["TransactItems"])


def test_a_job_of_a_project_found_busy_is_written_queued_in_one_transaction(monkeypatch):
    """queue_first (intake.busy_projects): no try at the lock, the queue slot in the first call."""
    dynamo = Dynamo(lambda body: (200, {}))
    envelope = _largest_envelope()
    assert _create(monkeypatch, dynamo, envelope, queue_first=True) == job_creation.Created(envelope.job_id)
    (only,) = dynamo.sent
    with pytest.raises(AssertionError):
        _action(only, "LOCK#")
    _, job = _action(only, "JOB#")
    assert job["Item"]["status"] == {"S": "queued"} and "machine" not in job["Item"]
    assert _action(only, "COUNTER#queued")[0] == "Update"


@pytest.mark.parametrize("lock_refuses", [False, True])
def test_a_job_of_a_project_found_busy_tries_the_free_lock_before_a_full_queue_refuses_it(
    monkeypatch, lock_refuses
):
    """The queue's condition refuses the queued write: the lock, only remembered taken, is tried in
    a second call, and the job that takes it runs; refused there too, the queue is full."""
    counter_refused = _cancelled(
        [{"Code": "None"}] * 3
        + [{"Code": "ConditionalCheckFailed", "Item": {"queued": {"N": "50"}}}]
        + [{"Code": "None"}] * 2
    )
    lock_refused = _cancelled(
        [{"Code": "None"}] * 3 + [{"Code": "ConditionalCheckFailed"}] + [{"Code": "None"}] * 2
    )
    answers = [counter_refused, lock_refused if lock_refuses else (200, {}), counter_refused]
    dynamo = Dynamo(lambda body: answers[len(dynamo.sent) - 1])
    envelope = _largest_envelope()
    outcome = _create(monkeypatch, dynamo, envelope, queue_first=True)
    if lock_refuses:
        assert outcome == job_creation.QueueFull(50, 50)
        assert len(dynamo.sent) == 3  # queued, the lock, queued again: then refused
        return
    assert outcome == job_creation.Created(envelope.job_id, took_lock=True)
    _, second = dynamo.sent
    assert _action(second, "LOCK#")[0] == "Update"
    _, job = _action(second, "JOB#")
    assert job["Item"]["status"] == {"S": "running"}


def test_a_duplicate_refused_with_the_lock_too_is_the_duplicate(monkeypatch):
    """A repeat of work whose first job still holds the project's lock: both conditions refuse,
    and the dedup record's answer wins: nothing is written, no second call."""
    dynamo = Dynamo(
        lambda body: _cancelled(
            [
                {
                    "Code": "ConditionalCheckFailed",
                    "Item": {"job_id": {"S": "job_earlier"}, "expires_at": {"N": str(10**10)}},
                },
                {"Code": "None"},
                {"Code": "None"},
                {"Code": "ConditionalCheckFailed"},
                {"Code": "None"},
                {"Code": "None"},
            ]
        )
    )
    assert _create(monkeypatch, dynamo, _largest_envelope()) == job_creation.Duplicate(
        "job_earlier", "idempotency_key"
    )
    assert len(dynamo.sent) == 1
