"""Patches over moto's server and its answers: how it finds a request's service, and how it
serializes an answer. Both are about speed; each docstring names the moto 5.2.5 behaviour it
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

    listed_once._relevo_listed_once = True  # type: ignore[attr-defined]
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
    picker._relevo_original_get_possible_keys = possible_keys  # type: ignore[attr-defined]
    picker._relevo_keys_once = True  # type: ignore[attr-defined]
