"""A small evaluator of IAM policy documents, for the template's own checks (no maintained Python
evaluator covers service principals and condition operators: moto's ignores every operator but
StringEquals and every principal but AWS ones).

What it decides, after AWS's policy evaluation logic (IAM User Guide, "Policy evaluation logic"
and "IAM JSON policy elements: Condition operators"): a request (principal, action, resource,
request context) is allowed by a set of documents when some statement allows it and none denies
it. Supported: Principal `"*"` / `AWS` / `Service`, Action / NotAction, Resource / NotResource
(wildcards `*` and `?`), and the String, Arn, Bool and Null operators with `IfExists` and the
`ForAllValues:` / `ForAnyValue:` qualifiers. A key absent from the context fails a positive
operator and passes a negated one. Anything else raises UnsupportedPolicy instead of guessing.

Policy variables (`${aws:PrincipalTag/job}`, with a default `${aws:PrincipalTag/job, 'none'}`)
in Resource and condition values are replaced by the
request context's value of that key ("IAM policy elements: Variables and tags", IAM User Guide). A
variable with no value makes its whole statement not apply, as the guide warns it may ("If AWS
cannot resolve a variable this might cause the entire statement to be invalid"): a grant that
names a session tag the session lacks grants nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from fnmatch import fnmatchcase
from typing import Any


class UnsupportedPolicy(ValueError):
    """A policy element the evaluator does not implement; extend it rather than guess."""


class PolicyDecision(Enum):
    ALLOW = "allow"
    DENY = "deny"  # an explicit Deny matched
    NO_MATCH = "no match"  # implicit deny


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    # {"Service": "cloudwatch.amazonaws.com"} or {"AWS": role ARN}; None for identity policies.
    principal: dict[str, str] | None = None
    context: dict[str, str | list[str]] = field(default_factory=dict)


def evaluate(documents: list[dict[str, Any]], request: Request) -> PolicyDecision:
    allowed = False
    for document in documents:
        for statement in _as_list(document.get("Statement", [])):
            if not _applies(statement, request):
                continue
            if statement.get("Effect") == "Deny":
                return PolicyDecision.DENY
            allowed = True
    return PolicyDecision.ALLOW if allowed else PolicyDecision.NO_MATCH


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _wildcard(pattern: str, value: str, ignore_case: bool = False) -> bool:
    if ignore_case:
        pattern, value = pattern.lower(), value.lower()
    # fnmatch's [] classes are not IAM wildcards: escape them.
    return fnmatchcase(value, re.sub(r"([\[\]])", r"[\1]", pattern))


_VARIABLE = re.compile(r"\$\{([^}]*)\}")


class _Unresolved(Exception):
    """A policy variable whose key has no value in the request context."""


def _resolve(text: str, context: dict[str, str | list[str]]) -> str:
    """`text` with each policy variable replaced by its value (raises _Unresolved)."""
    values = {k.lower(): v for k, v in context.items()}

    def one(found: re.Match[str]) -> str:
        inside = found.group(1)
        if inside in ("*", "?", "$"):
            raise UnsupportedPolicy(f"the escape ${{{inside}}}")
        key, _, default = inside.partition(",")
        value = values.get(key.strip().lower())
        if isinstance(value, list):
            value = value[0] if len(value) == 1 else None  # a multivalued key is no variable
        if value is None:
            default = default.strip()
            if default.startswith("'") and default.endswith("'") and len(default) >= 2:
                return default[1:-1]
            raise _Unresolved(inside)
        return str(value)

    return _VARIABLE.sub(one, text)


def resolve_statement(
    statement: dict[str, Any], context: dict[str, str | list[str]]
) -> dict[str, Any] | None:
    """The statement with its Resource / NotResource and condition values resolved from the
    request context; None when a variable has no value there (the statement then does not apply)."""
    if "${" not in json.dumps(statement):
        return statement
    try:
        return _with_variables(statement, context)
    except _Unresolved:
        return None


def _with_variables(statement: dict[str, Any], context: dict[str, str | list[str]]) -> dict[str, Any]:
    resolved = dict(statement)
    for element in ("Resource", "NotResource"):
        if element in statement:
            resolved[element] = [_resolve(str(r), context) for r in _as_list(statement[element])]
    if statement.get("Condition"):
        resolved["Condition"] = {
            operator: {
                key: [_resolve(str(v), context) if isinstance(v, str) else v for v in _as_list(values)]
                for key, values in block.items()
            }
            for operator, block in statement["Condition"].items()
        }
    return resolved


def _applies(statement: dict[str, Any], request: Request) -> bool:
    resolved = resolve_statement(statement, request.context)
    if resolved is None:
        return False
    statement = resolved
    if "NotPrincipal" in statement:
        raise UnsupportedPolicy("NotPrincipal")
    if "Principal" in statement and not _principal_matches(statement["Principal"], request.principal):
        return False
    if "Action" in statement:
        if not any(
            _wildcard(str(a), request.action, ignore_case=True) for a in _as_list(statement["Action"])
        ):
            return False
    elif any(
        _wildcard(str(a), request.action, ignore_case=True) for a in _as_list(statement.get("NotAction", []))
    ):
        return False
    if "Resource" in statement:
        if not any(_wildcard(str(r), request.resource) for r in _as_list(statement["Resource"])):
            return False
    elif any(_wildcard(str(r), request.resource) for r in _as_list(statement.get("NotResource", []))):
        return False
    return all(
        _condition_holds(operator, key, _as_list(values), request.context)
        for operator, block in (statement.get("Condition") or {}).items()
        for key, values in block.items()
    )


def _principal_matches(principal: Any, requester: dict[str, str] | None) -> bool:
    if requester is None:
        raise UnsupportedPolicy("a resource policy (it has Principal) evaluated without a principal")
    if principal == "*":
        return True
    ((kind, who),) = requester.items()
    # Principal {"AWS": "*"} is every AWS account's principals, not AWS services.
    return any(p == who or (kind == "AWS" and p == "*") for p in _as_list(principal.get(kind, [])))


_STRING = {
    "StringEquals": (lambda p, v: p == v, False),
    "StringNotEquals": (lambda p, v: p == v, True),
    "StringEqualsIgnoreCase": (lambda p, v: p.lower() == v.lower(), False),
    "StringNotEqualsIgnoreCase": (lambda p, v: p.lower() == v.lower(), True),
    "StringLike": (lambda p, v: _wildcard(p, v), False),
    "StringNotLike": (lambda p, v: _wildcard(p, v), True),
    "ArnEquals": (lambda p, v: p == v, False),
    "ArnNotEquals": (lambda p, v: p == v, True),
    "ArnLike": (lambda p, v: _wildcard(p, v), False),
    "ArnNotLike": (lambda p, v: _wildcard(p, v), True),
    "Bool": (lambda p, v: p.lower() == v.lower(), False),
}


def _condition_holds(operator: str, key: str, policy_values: list[Any], context: dict[str, Any]) -> bool:
    qualifier, _, name = operator.rpartition(":")
    if_exists = name.endswith("IfExists")
    name = name.removesuffix("IfExists")
    present = {k.lower(): _as_list(v) for k, v in context.items()}.get(key.lower())
    expected = [str(v).lower() if isinstance(v, bool) else str(v) for v in policy_values]
    if name == "Null":
        if qualifier or if_exists:
            raise UnsupportedPolicy(f"{operator}")
        return (present is None) == (expected == ["true"])
    if name not in _STRING or qualifier not in ("", "ForAllValues", "ForAnyValue"):
        raise UnsupportedPolicy(f"condition operator {operator}")
    match, negated = _STRING[name]
    if present is None:
        if qualifier == "ForAllValues":
            return True  # vacuously: every one of no values matches
        if qualifier == "ForAnyValue":
            return False
        return if_exists or negated

    def one(value: str) -> bool:
        found = any(match(p, str(value)) for p in expected)
        return not found if negated else found

    if qualifier == "ForAllValues":
        return all(one(v) for v in present)
    if qualifier == "ForAnyValue":
        return any(one(v) for v in present)
    if len(present) != 1:
        raise UnsupportedPolicy(f"{operator} on the multivalued context key {key}")
    return one(present[0])
