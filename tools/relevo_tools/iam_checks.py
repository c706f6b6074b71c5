"""The IAM lint's checks of one policy statement (relevo_tools.iam_lint): parliament's, the fit
of each action to its resources, DynamoDB index names, and set operators on condition keys."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from relevo_tools.iam_policies import PolicyDocument, Renderer, as_list

# Global condition keys that are multivalued (AWS IAM guide, "AWS global condition context keys");
# every other aws: key is single-valued.
MULTIVALUED_GLOBAL_KEYS = {
    "aws:calledvia",
    "aws:principalorgpaths",
    "aws:principalservicenameslist",
    "aws:resourceorgpaths",
    "aws:tagkeys",
}


# ---------------------------------------------------------------- checks


@dataclass(frozen=True)
class Finding:
    owner: str
    policy: str
    sid: str  # "" when the statement has none
    code: str
    message: str

    def where(self) -> str:
        statement = f" statement {self.sid}" if self.sid else ""
        return f"{self.owner} {self.policy}{statement}"


@cache
def _parliament() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # parliament imports the deprecated pkg_resources
        import parliament

    return parliament


@cache
def _canonical_actions(service: str) -> dict[str, str]:
    from policy_sentry.querying.actions import get_actions_for_service

    return {a.split(":", 1)[1].lower(): a.split(":", 1)[1] for a in get_actions_for_service(service)}


def _privilege(action: str) -> dict[str, Any] | None:
    from policy_sentry.querying.actions import get_privilege_info

    service, _, name = action.partition(":")
    canonical = _canonical_actions(service.lower()).get(name.lower())
    return get_privilege_info(service.lower(), canonical) if canonical else None


def _expanded(actions: list[str]) -> list[str]:
    from policy_sentry.analysis.expand import determine_actions_to_expand

    wildcard = [a for a in actions if "*" in a or "?" in a]
    return sorted({*(a for a in actions if a not in wildcard), *determine_actions_to_expand(wildcard)})


def _parliament_findings(document: dict[str, Any], statement: dict[str, Any]) -> Iterator[tuple[str, str]]:
    single = (
        {"Version": document.get("Version"), "Statement": [statement]}
        if "Version" in document
        else {"Statement": [statement]}
    )
    parliament = _parliament()
    for finding in parliament.analyze_policy_string(json.dumps(single)).findings:
        parliament.enhance_finding(finding)
        yield finding.issue, f"{finding.title}: {finding.detail}" if finding.detail else finding.title


def _resource_fit(statement: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Each action has a resource of a type it takes; each resource is of a type some action takes."""
    from policy_sentry.util.arns import does_arn_match

    if statement.get("Effect") != "Allow" or "Action" not in statement or "Resource" not in statement:
        return
    resources = [str(r) for r in as_list(statement["Resource"])]
    arns = [r for r in resources if r != "*" and r.startswith("arn:")]
    taken_by: dict[str, list[str]] = {r: [] for r in arns}
    typed = False  # some action takes a resource type (else "must be *" says it all)
    named = {str(a).lower() for a in as_list(statement["Action"])}
    for action in _expanded([str(a) for a in as_list(statement["Action"])]):
        privilege = _privilege(action)
        if privilege is None:
            continue  # parliament reports unknown actions
        service_resources = privilege["service_resources"]
        types = {
            t: service_resources[t]["arn"]
            for t in privilege["resource_types"]
            if t and t in service_resources
        }
        if not types:
            # Only an action the statement names must have "*"; a wildcard (kms:* in a key
            # policy) merely also covers actions that take no resource.
            if "*" not in resources and action.lower() in named:
                yield (
                    "RESOURCE_FIT",
                    f"{action} takes no resource type (Service Authorization Reference): its Resource must "
                    f'be "*", not {", ".join(resources)}',
                )
            continue
        typed = True
        fitting = [r for r in arns if any(does_arn_match(r, arn_format) for arn_format in types.values())]
        for r in fitting:
            taken_by[r].append(action)
        if not fitting and "*" not in resources:
            yield (
                "RESOURCE_FIT",
                f"{action} takes {', '.join(sorted(types))} ({'; '.join(sorted(types.values()))}); none of "
                f"{', '.join(resources)} is one",
            )
    for resource, actions in taken_by.items():
        if not actions and typed:
            yield (
                "RESOURCE_FIT",
                f"{resource} is of no resource type that "
                f"{', '.join(str(a) for a in as_list(statement['Action']))} take",
            )


def _index_names(statement: dict[str, Any], tables: dict[str, set[str]]) -> Iterator[tuple[str, str]]:
    for resource in as_list(statement.get("Resource", [])):
        found = re.fullmatch(r"arn:[^:]+:dynamodb:[^:]*:[^:]*:table/([^/]+)/index/([^/]+)", str(resource))
        if (
            found
            and found.group(1) in tables
            and found.group(2) != "*"
            and found.group(2) not in tables[found.group(1)]
        ):
            known = ", ".join(sorted(tables[found.group(1)])) or "none"
            yield "UNKNOWN_INDEX", f"table {found.group(1)} has no index {found.group(2)} (it has {known})"


def _key_is_multivalued(key: str) -> bool | None:
    from policy_sentry.querying.conditions import get_condition_value_type

    lower = key.lower()
    if lower.startswith("aws:"):
        return lower in MULTIVALUED_GLOBAL_KEYS
    try:
        value_type = get_condition_value_type(lower)
    except Exception:  # policy_sentry raises for a service it does not know; parliament reports the key
        return None
    return None if value_type is None else value_type.startswith("arrayof")


def _set_operators(statement: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for operator, block in (statement.get("Condition") or {}).items():
        set_operator = operator.split(":", 1)[0] if ":" in operator else None
        for key in block if isinstance(block, dict) else {}:
            multivalued = _key_is_multivalued(key)
            if multivalued is False and set_operator in ("ForAllValues", "ForAnyValue"):
                yield (
                    "SET_OPERATOR_ON_SINGLE_VALUED_KEY",
                    (
                        f"{operator} on {key}, a single-valued key: ForAllValues matches when the key is "
                        "absent "
                        "and is too permissive; use the operator without the set qualifier"
                    ),
                )
            if multivalued and set_operator is None and operator != "Null":
                yield (
                    "MULTIVALUED_KEY_WITHOUT_SET_OPERATOR",
                    (
                        f"{operator} on {key}, a multivalued key: qualify it with ForAllValues: or "
                        "ForAnyValue:"
                    ),
                )


def tables_of(cfn: dict[str, Any], renderer: Renderer) -> dict[str, set[str]]:
    tables = {}
    for logical_id, resource in cfn.get("Resources", {}).items():
        if resource.get("Type") == "AWS::DynamoDB::Table" and renderer.exists(logical_id):
            props = resource.get("Properties", {})
            indexes = props.get("GlobalSecondaryIndexes", []) + props.get("LocalSecondaryIndexes", [])
            tables[renderer.ref(logical_id)] = {str(renderer.value(i["IndexName"])) for i in indexes}
    return tables


def findings_of(document: PolicyDocument, tables: dict[str, set[str]]) -> list[Finding]:
    found = []
    statements = as_list(document.document.get("Statement", []))
    sids = [s.get("Sid") for s in statements if s.get("Sid")]
    for sid in sorted({s for s in sids if sids.count(s) > 1}):
        found.append(
            Finding(document.owner, document.name, sid, "DUPLICATE_SID", f"Sid {sid} is used more than once")
        )
    for statement in statements:
        sid = str(statement.get("Sid", ""))
        for code, message in (
            *_parliament_findings(document.document, statement),
            *_resource_fit(statement),
            *_index_names(statement, tables),
            *_set_operators(statement),
        ):
            found.append(Finding(document.owner, document.name, sid, code, message))
    return found
