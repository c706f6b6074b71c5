"""The job's one transaction, with the webhook delivery's record in it (issue 29), against what
DynamoDB takes and answers.

AWS ("TransactWriteItems", DynamoDB API Reference): up to 100 actions, no two on the same item,
4 MB for the items in all (an item at most 400 KB); the whole transaction or nothing. A refused
condition cancels it with TransactionCanceledException, whose CancellationReasons hold one reason
per action in request order, the refused item with it under ReturnValuesOnConditionCheckFailure
ALL_OLD. ClientRequestToken makes the call idempotent for 10 minutes; botocore fills it in (an
idempotency token in DynamoDB's service model).

Given the largest envelope intake can write (relevo_core.plan_limits) and a delivery's record,
when store.jobs.create_job sends its transaction through a real botocore client that answers in
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
from relevo_core.store import jobs
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

    def __init__(self, answer: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]) -> None:
        self.sent: list[dict[str, Any]] = []
        self.client = boto3.client(
            "dynamodb", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s"
        )

        def before_call(params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
            body = json.loads(params["body"])
            self.sent.append(body)
            status, parsed = answer(body)

            class Http:
                status_code = status
                headers: dict[str, str] = {}

            return Http(), parsed

        self.client.meta.events.register("before-call.dynamodb.TransactWriteItems", before_call)


def _create(monkeypatch: pytest.MonkeyPatch, dynamo: Dynamo, envelope: Any) -> jobs.CreateOutcome:
    monkeypatch.setattr(jobs, "client", lambda service: dynamo.client)
    return jobs.create_job(TABLE, envelope, 86_400, 50, NOW, refuse_frozen=True, also_write=[_record_put()])


def _cancelled(reasons: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    return 400, {
        "Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"},
        "CancellationReasons": reasons,
    }


def test_the_largest_job_transaction_is_within_what_dynamodb_takes(monkeypatch):
    dynamo = Dynamo(lambda body: (200, {}))
    envelope = _largest_envelope()

    assert _create(monkeypatch, dynamo, envelope) == jobs.Created(envelope.job_id)

    [request] = dynamo.sent
    actions = request["TransactItems"]
    assert len(actions) == 6 <= MAX_ACTIONS  # dedup, delivery id, job, queue slot, frozen check, the record
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
    assert _create(monkeypatch, dynamo, _largest_envelope()) == jobs.Duplicate(
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
    assert _create(monkeypatch, dynamo, _largest_envelope()) == jobs.Duplicate("job_earlier", "delivery")
    assert len(dynamo.sent) == 1


def test_our_own_write_met_again_is_the_job_created(monkeypatch):
    """A repeat of a transaction that did commit (a retry after its answer was lost, beyond the
    token's 10 minutes) is cancelled by its own dedup record: it reads as created, and writes no
    second record."""
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
        )
    )
    assert _create(monkeypatch, dynamo, envelope) == jobs.Created(envelope.job_id)
    assert len(dynamo.sent) == 1
