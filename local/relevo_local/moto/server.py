"""Patches over moto's server and its answers: how it finds a request's service, and how it
serializes an answer. Each is about speed; each docstring names the moto 5.2.5 behaviour it
changes; docs/emulator.md lists them with the test that pins each."""

from __future__ import annotations

from typing import Any


def list_moto_modules_once() -> None:
    """moto 5.2.5's server finds a request's service by calling backends.list_of_moto_modules(),
    which lists moto's package directory and stats each of its some 150 entries, on every request
    (DomainDispatcherApplication.get_backend_for_host): about a sixteenth of a busy test worker's
    CPU (py-spy). The package does not change while the emulator runs, so it is listed once."""
    from moto import backends

    if getattr(backends.list_of_moto_modules, "_relevo_listed_once", False):
        return
    modules = tuple(backends.list_of_moto_modules())

    def listed_once() -> tuple[str, ...]:
        return modules

    listed_once._relevo_listed_once = True
    backends.list_of_moto_modules = listed_once


def pick_members_of_plain_answers_once() -> None:
    """moto 5.2.5 serializes an answer by walking its operation's output shape, and for each member
    of each structure asks six alias providers under which keys the value might be found
    (XFormedAttributePicker.get_possible_keys): for a DynamoDB item every attribute value is an
    AttributeValue structure of ten members, so this was about half the emulator's time for a
    Query of a job's items. For a plain dict, what DynamoHandler answers with, the keys depend on
    nothing but the member's shape and name: a dict has no Meta (ExplicitAlias), its class name is
    always "dict" (ClassPrefixAlias), and a member shape is always a member of the same structure
    (botocore caches StructureShape.members, so ShapePrefixAlias and ShapeNameAlias see the same
    parent each time). So they are worked out once per shape member; for any other object, as
    before."""
    from moto.core import serialize

    picker = serialize.XFormedAttributePicker
    if getattr(picker, "_relevo_keys_once", False):
        return
    possible_keys = picker.get_possible_keys
    known: dict[tuple[Any, str], tuple[str, ...]] = {}

    def get_possible_keys(self: Any, context: Any) -> Any:
        if type(context.obj) is not dict or self.alias_providers is not serialize.DEFAULT_ALIAS_PROVIDERS:
            return possible_keys(self, context)
        found = known.get((context.shape, context.key))
        if found is None:
            found = known[(context.shape, context.key)] = tuple(possible_keys(self, context))
        return found

    picker.get_possible_keys = get_possible_keys
    picker._relevo_original_get_possible_keys = possible_keys
    picker._relevo_keys_once = True


def serialize_attribute_values_directly() -> None:
    """moto 5.2.5 serializes a DynamoDB answer by walking its output shape, and every attribute
    value of every item is an AttributeValue structure of ten members (S, N, B, SS, NS, BS, M, L,
    NULL, BOOL), each looked up through the value picker and serialized through its own method:
    three quarters of the emulator's time for a Query of one job record (py-spy), and a tenth of
    every call on a stage's way from the queue to its command. An attribute value moto answers
    with is a plain dict holding only those members, so it is serialized here member by member
    as moto's JSON serializer would (a string as str(), a blob as moto's base64, a map and a list
    of attribute values recursively); a dict with any other key, or an answer with response
    transformers, takes moto's own walk."""
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
