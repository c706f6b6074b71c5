"""DynamoDB requests authorized on the emulator as AWS authorizes them: item by item, on the table
or index each names, and with DynamoDB's fine-grained condition keys.

moto 5.2.5 checks `dynamodb:TransactWriteItems` as an action of its own (no policy can grant it on
AWS) and ignores every condition but StringEquals, so `dynamodb:LeadingKeys` and
`dynamodb:Attributes`, which keep each role to its own item kinds and attributes, were never
checked locally. Here, after moto's own check of the action and resource passes, the caller's
policies are evaluated again with the request's condition context (relevo_local.iam_evaluation).

The context, after "Using IAM policy conditions for fine-grained access control" (Amazon DynamoDB
Developer Guide):
- `dynamodb:LeadingKeys`: the partition key value of each item the request reads or writes; for a
  Query on the table, the partition key value of its key condition. A Query on an index, or a Scan,
  names no item: the key is absent (a `ForAllValues` condition on it then holds, as on AWS).
- `dynamodb:Attributes`: the top-level attribute names the request names: the key's, an item's, and
  those of its update, condition and projection expressions. A request without a projection
  expression that reads whole items (GetItem, Query) leaves it absent here; AWS counts every
  attribute then, so a policy that limits read attributes would refuse what passes locally (no
  Relevo policy limits them).
- `dynamodb:ReturnValues` and `dynamodb:Select`, when the request sets them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from relevo_local.iam_evaluation import PolicyDecision, Request, evaluate
from relevo_local.identity import ACCOUNT_ID, policy_documents

_PATCHED: set[str] = set()

# AWS authorizes a transaction item by item, as the single-item action it performs ("Using IAM
# with DynamoDB transactions", Amazon DynamoDB Developer Guide): there is no IAM action
# TransactWriteItems or TransactGetItems to grant.
TRANSACTION_ITEM_ACTIONS = {
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
    "ConditionCheck": "dynamodb:ConditionCheckItem",
    "Get": "dynamodb:GetItem",
}
# Words of DynamoDB's expression grammar that are not attribute names.
_GRAMMAR = {"set", "remove", "add", "delete", "and", "or", "not", "between", "in"}
_NAME = re.compile(r"(?<![\w.#:\]])(#?[A-Za-z_][A-Za-z0-9_]*)\b(?!\s*\()")


def table_arn(region: str, table: str, index: str | None = None) -> str:
    arn = f"arn:aws:dynamodb:{region}:{ACCOUNT_ID}:table/{table}"
    return f"{arn}/index/{index}" if index else arn


def expression_attributes(expression: str | None, names: dict[str, str] | None) -> set[str]:
    """The top-level attribute names an expression reads or writes (`a.b[0]` counts as `a`;
    `:values` and function names are not attributes)."""
    if not expression:
        return set()
    found = set()
    for token in _NAME.findall(expression):
        if token.lower() in _GRAMMAR:
            continue
        found.add((names or {}).get(token, token) if token.startswith("#") else token)
    return found


def _hash_key(region: str, table: str) -> str:
    from moto.dynamodb.models import dynamodb_backends

    return str(dynamodb_backends[ACCOUNT_ID][region].get_table(table).hash_key_attr)


def _string(value: dict[str, Any] | None) -> str | None:
    """An attribute value as IAM compares it (strings and numbers as text)."""
    if not value:
        return None
    kind, raw = next(iter(value.items()))
    return str(raw) if kind in ("S", "N", "B") else None


def _query_partition_value(request: dict[str, Any], hash_key: str) -> str | None:
    names = request.get("ExpressionAttributeNames") or {}
    for alias, _target in [(hash_key, hash_key), *((a, t) for a, t in names.items() if t == hash_key)]:
        found = re.search(
            rf"(?<![\w#]){re.escape(alias)}\s*=\s*(:\w+)", request.get("KeyConditionExpression") or ""
        )
        if found:
            return _string((request.get("ExpressionAttributeValues") or {}).get(found.group(1)))
    return None


def item_context(operation: str, request: dict[str, Any], region: str) -> dict[str, list[str]]:
    """The condition context of one single-item request (`operation` as in a transaction item:
    Put, Update, Delete, ConditionCheck, Get) or of a Query / Scan."""
    context: dict[str, list[str]] = {}
    table = request.get("TableName")
    names = request.get("ExpressionAttributeNames")
    attributes: set[str] = set()
    if operation == "Put":
        item = request.get("Item") or {}
        attributes |= set(item)
        key_value = _string(item.get(_hash_key(region, table))) if table else None
    elif operation == "Query":
        key_value = (
            None
            if request.get("IndexName")
            else _query_partition_value(
                request,
                _hash_key(region, table),  # type: ignore[arg-type]  # a Query names its table
            )
        )
        attributes |= expression_attributes(request.get("ProjectionExpression"), names)
        if request.get("Select"):
            context["dynamodb:Select"] = [request["Select"]]
    elif operation == "Scan":
        key_value = None
    else:
        key = request.get("Key") or {}
        attributes |= set(key)
        key_value = _string(key.get(_hash_key(region, table))) if table else None
        attributes |= expression_attributes(request.get("UpdateExpression"), names)
        attributes |= expression_attributes(request.get("ProjectionExpression"), names)
    if operation in ("Put", "Update", "Delete", "ConditionCheck"):
        attributes |= expression_attributes(request.get("ConditionExpression"), names)
    if key_value is not None:
        context["dynamodb:LeadingKeys"] = [key_value]
    if attributes and (operation != "Get" or request.get("ProjectionExpression")):
        context["dynamodb:Attributes"] = sorted(attributes)
    if request.get("ReturnValues"):
        context["dynamodb:ReturnValues"] = [request["ReturnValues"]]
    return context


_SINGLE = {
    "dynamodb:GetItem": "Get",
    "dynamodb:PutItem": "Put",
    "dynamodb:UpdateItem": "Update",
    "dynamodb:DeleteItem": "Delete",
    "dynamodb:Query": "Query",
    "dynamodb:Scan": "Scan",
}


def checks(
    action: str, request: dict[str, Any], region: str
) -> Iterator[tuple[str, str, dict[str, list[str]]]]:
    """Each (action, resource, condition context) AWS authorizes for one DynamoDB request."""
    if action in ("dynamodb:TransactWriteItems", "dynamodb:TransactGetItems"):
        for item in request.get("TransactItems", []):
            for kind, operation in item.items():
                yield (
                    TRANSACTION_ITEM_ACTIONS[kind],
                    table_arn(region, operation["TableName"]),
                    item_context(kind, operation, region),
                )
    elif action == "dynamodb:BatchWriteItem":
        for table, writes in (request.get("RequestItems") or {}).items():
            for write in writes:
                kind, operation = next(iter(write.items()))
                single = {"TableName": table, **operation}
                yield (
                    action,
                    table_arn(region, table),
                    item_context("Put" if kind == "PutRequest" else "Delete", single, region),
                )
    elif action == "dynamodb:BatchGetItem":
        for table, reads in (request.get("RequestItems") or {}).items():
            for key in reads.get("Keys", []):
                single = {
                    "TableName": table,
                    "Key": key,
                    "ProjectionExpression": reads.get("ProjectionExpression"),
                    "ExpressionAttributeNames": reads.get("ExpressionAttributeNames"),
                }
                yield action, table_arn(region, table), item_context("Get", single, region)
    elif action in _SINGLE and request.get("TableName"):
        yield (
            action,
            table_arn(region, request["TableName"], request.get("IndexName")),
            item_context(_SINGLE[action], request, region),
        )
    else:
        yield action, "", {}


def authorize_dynamodb_as_aws_does() -> None:
    """Check each DynamoDB request the way AWS does (module docstring): one check per item of a
    transaction or batch, each on its own action and table, then the caller's policies with the
    request's condition context. moto 5.2.5 checks the whole request as one action (TransactWriteItems
    too, which no policy can grant) and evaluates no condition but StringEquals."""
    if "dynamodb" in _PATCHED:
        return
    from moto.iam.access_control import IAMRequestBase

    original: Callable[[Any, str], None] = IAMRequestBase.check_action_permitted

    def check_action_permitted(self: Any, resource: str) -> None:
        if not self._action.startswith("dynamodb:"):
            return original(self, resource)
        request = json.loads(self._body or "{}")
        whole = self._action
        try:
            for action, item_resource, context in checks(whole, request, self._region):
                self._action = action
                original(self, item_resource or resource)
                if not context:
                    continue
                decision = evaluate(
                    policy_documents(self._access_key.collect_policies()),
                    Request(action, item_resource, context=context),  # type: ignore[arg-type]  # lists: ok
                )
                if decision is not PolicyDecision.ALLOW:
                    self._raise_access_denied()
        finally:
            self._action = whole

    IAMRequestBase.check_action_permitted = check_action_permitted
    _PATCHED.add("dynamodb")
