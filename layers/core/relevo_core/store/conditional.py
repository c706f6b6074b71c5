"""A conditional UpdateItem whose refused condition is an answer, not an error."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client


def update_if(**kwargs: Any) -> bool:
    """UpdateItem with its ConditionExpression; False (nothing written) when the condition fails."""
    try:
        client("dynamodb").update_item(**kwargs)
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return False
        raise
    return True
