"""Every request and answer of the local App Store Connect against Apple's description
(relevo_local.apple.description): the method and path are an operation of it, each query parameter
is one the operation declares (a list's values from its enum), the body matches the operation's
request schema, the answer's status is one the operation declares and its body that status's schema.

Stricter than the description in one way, on purpose: an object that lists its properties is
closed, so a field the description does not name (a typo, a field of another resource) is a
mismatch rather than passing unseen. The schemas are OpenAPI 3.0 (`nullable`): their own validator."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from openapi_schema_validator import OAS30Validator

from relevo_local.apple.description import description


@dataclass(frozen=True)
class Operation:
    operation_id: str
    template: str
    spec: dict[str, Any]


class NotInDescription(LookupError):
    pass


def _closed(node: Any) -> Any:
    if isinstance(node, dict):
        closed = {key: _closed(value) for key, value in node.items()}
        if "properties" in closed and "additionalProperties" not in closed:
            closed["additionalProperties"] = False
        return closed
    if isinstance(node, list):
        return [_closed(value) for value in node]
    return node


@lru_cache(maxsize=1)
def _components() -> dict[str, Any]:
    return {"schemas": _closed(copy.deepcopy(description()["components"]["schemas"]))}


@lru_cache(maxsize=1)
def _templates() -> list[tuple[re.Pattern[str], str]]:
    templates = sorted(description()["paths"], key=lambda t: (t.count("{"), t))
    return [(re.compile("^" + re.sub(r"\\\{(\w+)\\\}", r"[^/]+", re.escape(t)) + "$"), t) for t in templates]


def operation(method: str, path: str) -> Operation:
    for pattern, template in _templates():
        if pattern.match(path) and method.lower() in description()["paths"][template]:
            spec = description()["paths"][template][method.lower()]
            return Operation(str(spec["operationId"]), template, spec)
    raise NotInDescription(f"{method} {path} is no operation of App Store Connect's description")


def schema_problems(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    validator = OAS30Validator({**schema, "components": _components()})
    return [
        f"{where}{''.join(f'.{p}' for p in error.absolute_path)}: {error.message}"
        for error in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    ]


def _query_problems(op: Operation, query: dict[str, str]) -> list[str]:
    declared = {p["name"]: p for p in op.spec.get("parameters", []) if p["in"] == "query"}
    problems = []
    for name, raw in query.items():
        parameter = declared.get(name)
        if parameter is None:
            problems.append(f"query parameter {name} is not one {op.operation_id} declares")
            continue
        schema = parameter["schema"]
        if schema["type"] == "array":
            # Lists are comma-separated (the generated client's `explode: false`).
            values: Any = raw.split(",")
        elif schema["type"] == "integer":
            values = int(raw) if raw.isdigit() else raw
        else:
            values = raw
        problems += schema_problems(values, schema, f"query {name}")
    return problems


def request_problems(method: str, path: str, query: dict[str, str], body: Any) -> list[str]:
    op = operation(method, path)
    problems = _query_problems(op, query)
    schema = op.spec.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if schema is not None:
        problems += schema_problems(body, schema, "body")
    elif body is not None:
        problems.append(f"{op.operation_id} takes no body")
    return problems


def response_problems(method: str, path: str, status: int, body: Any) -> list[str]:
    op = operation(method, path)
    answer = op.spec["responses"].get(str(status))
    if answer is None:
        return [f"{op.operation_id} declares no {status} answer (only {', '.join(op.spec['responses'])})"]
    schema = answer.get("content", {}).get("application/json", {}).get("schema")
    if schema is None:
        return [] if body is None else [f"{op.operation_id}'s {status} answer has no body"]
    return schema_problems(body, schema, "answer")
