"""A patch over moto's server: how it serializes a DynamoDB answer. It is about speed; its docstring
names the moto 5.2.5 behaviour it changes and the gain measured (tests/helpers/emulator_patches.py);
docs/emulator.md lists it with the test that pins it."""

from __future__ import annotations

from typing import Any


def serialize_attribute_values_directly() -> None:
    """moto 5.2.5 serializes a DynamoDB answer by walking its output shape, and every attribute
    value of every item is an AttributeValue structure of ten members (S, N, B, SS, NS, BS, M, L,
    NULL, BOOL), each looked up through the value picker and serialized through its own method:
    three quarters of the emulator's time for a Query of one job record (py-spy), and a tenth of
    every call on a stage's way from the queue to its command. An attribute value moto answers
    with is a plain dict holding only those members, so it is serialized here member by member
    as moto's JSON serializer would (a string as str(), a blob as moto's base64, a map and a list
    of attribute values recursively); a dict with any other key, or an answer with response
    transformers, takes moto's own walk.

    Measured gain (tests/helpers/emulator_patches.py, the patch switched off and on between interleaved
    integration-test-like four-stage jobs on the shared 2-core machine, medians): 0.20 s of the
    emulator's CPU per job at 0.80 s (a quarter), with 4,000 other items in the table 0.22 s."""
    from enum import Enum

    from moto.core import serialize

    json_serializer = serialize.BaseJSONSerializer
    if getattr(json_serializer, "_relevo_attribute_values_directly", False):
        return
    structure = json_serializer._serialize_type_structure

    def attribute_value(self: Any, value: dict[str, Any], shape: Any) -> dict[str, Any]:
        members = shape.members
        answer: dict[str, Any] = {}
        for name, member in members.items():
            found = value.get(name)
            if found is None:
                continue
            kind = member.type_name
            if kind == "string":
                if isinstance(found, Enum):
                    found = found.value
                answer[name] = str(found) if found not in (None, {}, []) else found
            elif kind == "blob":
                answer[name] = self._base64(found)
            elif kind == "boolean":
                answer[name] = found
            else:
                # Sets, maps and lists: moto's own list and map walk, whose attribute values come
                # back here.
                self._serialize(answer, found, member, name)
        return answer

    def _serialize_type_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        if (
            key
            and type(value) is dict
            and shape.name == "AttributeValue"
            and not shape.is_document_type
            and value.keys() <= shape.members.keys()
            and not getattr(self._value_picker, "response_transformers", None)
        ):
            serialized[self.get_serialized_name(shape, key)] = attribute_value(self, value, shape)
            return
        structure(self, serialized, value, shape, key)

    json_serializer._serialize_type_structure = _serialize_type_structure
    json_serializer._relevo_original_serialize_type_structure = structure
    json_serializer._relevo_attribute_values_directly = True
