"""Reading why a DynamoDB transaction was cancelled, the one helper every store module uses.

AWS (DynamoDB API Reference, CancellationReason): one reason per item, in the order of the
TransactWriteItems request; an item that passed has Code "None"; a refused ConditionExpression is
"ConditionalCheckFailed" and, with ReturnValuesOnConditionCheckFailure=ALL_OLD, carries the item.
"""

from __future__ import annotations

from botocore.exceptions import ClientError

from relevo_core.store.conditional import transaction_cancellation


def _error(code: str, reasons: list[dict] | None = None) -> ClientError:
    response: dict = {"Error": {"Code": code, "Message": "Transaction cancelled"}}
    if reasons is not None:
        response["CancellationReasons"] = reasons
    return ClientError(response, "TransactWriteItems")


def test_reasons_are_read_by_item_index() -> None:
    cancellation = transaction_cancellation(
        _error(
            "TransactionCanceledException",
            [
                {"Code": "None"},
                {"Code": "ConditionalCheckFailed", "Item": {"job_id": {"S": "j1"}, "n": {"N": "3"}}},
            ],
        )
    )
    assert cancellation is not None
    assert cancellation.codes == ["None", "ConditionalCheckFailed"]
    assert not cancellation.condition_failed(0)
    assert cancellation.condition_failed(1)
    assert cancellation.item(1) == {"job_id": "j1", "n": 3}
    assert cancellation.item(0) == {}


def test_an_index_past_the_reasons_did_not_refuse() -> None:
    cancellation = transaction_cancellation(
        _error("TransactionCanceledException", [{"Code": "TransactionConflict"}])
    )
    assert cancellation is not None
    assert cancellation.code(3) == "None"
    assert not cancellation.condition_failed(3)
    assert cancellation.item(3) == {}


def test_a_cancellation_without_reasons_has_none() -> None:
    cancellation = transaction_cancellation(_error("TransactionCanceledException"))
    assert cancellation is not None and cancellation.codes == []


def test_other_errors_are_not_cancellations() -> None:
    assert transaction_cancellation(_error("ConditionalCheckFailedException")) is None
    assert transaction_cancellation(_error("ProvisionedThroughputExceededException")) is None
