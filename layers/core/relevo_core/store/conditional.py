"""Refused conditions read as answers, not errors: a conditional PutItem, UpdateItem or DeleteItem,
and the reasons a transaction was cancelled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.store.codec import from_attributes


def _unless_refused(operation: str, kwargs: dict[str, Any]) -> bool:
    try:
        getattr(client("dynamodb"), operation)(**kwargs)
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            return False
        raise
    return True


def put_if(**kwargs: Any) -> bool:
    """PutItem with its ConditionExpression; False (nothing written) when the condition fails."""
    return _unless_refused("put_item", kwargs)


def update_if(**kwargs: Any) -> bool:
    """UpdateItem with its ConditionExpression; False (nothing written) when the condition fails."""
    return _unless_refused("update_item", kwargs)


def delete_if(**kwargs: Any) -> bool:
    """DeleteItem with its ConditionExpression; False (nothing deleted) when the condition fails."""
    return _unless_refused("delete_item", kwargs)


# A TransactWriteItems refusal: the whole transaction was cancelled, with one CancellationReason
# per item in request order, Code "None" for an item that passed its checks (DynamoDB API
# Reference, "CancellationReason" and "TransactWriteItems": TransactionCanceledException).
TRANSACTION_CANCELED = "TransactionCanceledException"
CONDITION_FAILED = "ConditionalCheckFailed"


@dataclass(frozen=True)
class TransactionCancellation:
    """Why a transaction was cancelled, item by item (the index of each item in TransactItems)."""

    reasons: tuple[dict[str, Any], ...]

    @property
    def codes(self) -> list[str]:
        return [str(reason.get("Code") or "None") for reason in self.reasons]

    def code(self, index: int) -> str:
        return self.codes[index] if 0 <= index < len(self.reasons) else "None"

    def condition_failed(self, index: int) -> bool:
        """True when item `index`'s ConditionExpression was what refused the transaction."""
        return self.code(index) == CONDITION_FAILED

    def item(self, index: int) -> dict[str, Any]:
        """The stored item that refused (ReturnValuesOnConditionCheckFailure=ALL_OLD), decoded;
        {} when the reason carries none."""
        if not 0 <= index < len(self.reasons):
            return {}
        return from_attributes(self.reasons[index].get("Item") or {})


def transaction_cancellation(exc: ClientError) -> TransactionCancellation | None:
    """The cancellation reasons of a TransactionCanceledException; None for any other error."""
    if error_code(exc) != TRANSACTION_CANCELED:
        return None
    reasons = exc.response.get("CancellationReasons") or ()
    return TransactionCancellation(tuple(reasons))  # type: ignore[arg-type]  # a TypedDict each: plain dicts
