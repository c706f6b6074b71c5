"""DynamoDB item form <-> plain JSON-compatible Python values, without loss."""

from __future__ import annotations

import base64
import json
import zlib
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


# A job record's frozen envelope, as the record stores it: its JSON compressed (zlib) and base64'd
# in one string attribute. DynamoDB charges a write by the whole item's size, the larger of before
# and after for an UpdateItem, 1 KB a WRU and twice that in a transaction ("DynamoDB read and write
# operations", Capacity unit consumption for write operations), and the job record is rewritten
# in transactions as the job moves; the guide's answer for a large attribute is to compress it
# ("Best practices for storing large items and attributes", Compressing large attribute values).
# A string, not a binary: a stream record's image and the state machine's copy of the record into
# a dead-letter entry carry it as it is, where a binary arrives base64'd in one and not the other.
PACKED_ENVELOPE = "packed_envelope"
# Where records written before the envelope was packed keep it: a map, read as it is.
ENVELOPE = "envelope"


def pack_envelope(envelope: dict[str, Any]) -> str:
    """The string a job record stores for `envelope` (JobEnvelope.to_json_dict()), without loss."""
    text = json.dumps(envelope, separators=(",", ":"), sort_keys=True)
    return base64.b64encode(zlib.compress(text.encode(), 9)).decode("ascii")


def envelope_of(record: dict[str, Any]) -> dict[str, Any]:
    """The envelope a job record (or its copy in an index, a stream image or a dead-letter entry)
    carries, packed or, for a record written before, as a map; {} when it carries none."""
    packed = record.get(PACKED_ENVELOPE)
    if isinstance(packed, str):
        return cast(dict[str, Any], json.loads(zlib.decompress(base64.b64decode(packed))))
    return dict(record.get(ENVELOPE) or {})
