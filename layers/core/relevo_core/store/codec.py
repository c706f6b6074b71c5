"""DynamoDB item form <-> plain JSON-compatible Python values, without loss."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def _to_dynamo(value: Any) -> Any:
    if isinstance(value, float):
        # DynamoDB numbers are decimals; go through str so 0.1 stays 0.1.
        return Decimal(str(value))
    if isinstance(value, dict):
        return {key: _to_dynamo(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_dynamo(item) for item in value]
    return value


def _from_dynamo(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {key: _from_dynamo(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_from_dynamo(item) for item in value]
    return value


def to_attributes(values: dict[str, Any]) -> dict[str, Any]:
    """Plain values -> DynamoDB low-level attribute map."""
    return {key: _serializer.serialize(_to_dynamo(value)) for key, value in values.items()}


def to_attribute(value: Any) -> dict[str, Any]:
    # boto3-stubs type the serializer's result as a TypedDict; it is this plain dict.
    return cast(dict[str, Any], _serializer.serialize(_to_dynamo(value)))


def from_attributes(item: dict[str, Any]) -> dict[str, Any]:
    """DynamoDB low-level attribute map -> plain values (ints stay ints)."""
    return {key: _from_dynamo(_deserializer.deserialize(value)) for key, value in item.items()}
