"""The table's global secondary indexes against two rules AWS enforces and the emulator does not.

- A GSI returns only the attributes it projects (a Query on it cannot fetch others from the
  table: "Projections", Global secondary indexes, DynamoDB Developer Guide). moto projects too,
  but nothing failed when code read an attribute an index leaves out: it was simply absent, as
  `journal_id` was from HeldByIndex, so a restarted agent never knew its own claims. Every query
  of an index that does not project everything must name what it reads (ProjectionExpression),
  what it names must be projected, and what the code around it reads of the items must be among
  what it named.
- An update creates or deletes one GSI and changes nothing of an existing one but its throughput
  (UpdateTable API reference, GlobalSecondaryIndexUpdates): template.yaml may differ from the
  indexes as released (released_indexes.json, with how to release more than one change) by one
  index added or deleted.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from relevo_local.template import load_sam_template

ROOT = Path(__file__).resolve().parents[2]
RELEASED = Path(__file__).with_name("released_indexes.json")
# Where Relevo's code queries the table (the emulator, local/relevo_local, and the tests are not Relevo's
# reads).
CODE = [
    ROOT / "layers" / "core" / "relevo_core",
    ROOT / "functions",
    ROOT / "agent" / "relevo_agent",
    ROOT / "cli" / "relevo_cli",
]
# Keys of a DynamoDB response and of an attribute value: what code reads that is no attribute.
RESPONSE_KEYS = {
    "Items",
    "Item",
    "LastEvaluatedKey",
    "Count",
    "ScannedCount",
    "ConsumedCapacity",
    "Attributes",
    "Responses",
    "S",
    "N",
    "B",
    "M",
    "L",
    "SS",
    "NS",
    "BS",
    "BOOL",
    "NULL",
}


@lru_cache(maxsize=1)
def _template() -> dict[str, Any]:
    return load_sam_template(ROOT / "template.yaml")


def _tables(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: resource["Properties"]
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::DynamoDB::Table"
    }


def _projected(table: dict[str, Any]) -> dict[str, set[str] | None]:
    """Each index's projected attributes (None: ALL): the table's keys, the index's keys, and
    for INCLUDE its NonKeyAttributes."""
    keys = {k["AttributeName"] for k in table["KeySchema"]}
    found: dict[str, set[str] | None] = {}
    for index in table.get("GlobalSecondaryIndexes", []):
        projection = index["Projection"]
        if projection["ProjectionType"] == "ALL":
            found[index["IndexName"]] = None
        else:
            found[index["IndexName"]] = (
                keys
                | {k["AttributeName"] for k in index["KeySchema"]}
                | set(projection.get("NonKeyAttributes", []))
            )
    return found


def _index_names() -> dict[str, str]:
    """relevo_core.store.keys' constants that name an index: constant name -> index name."""
    from relevo_core.store import keys

    return {
        name: value
        for name, value in vars(keys).items()
        if name.endswith("_INDEX") and isinstance(value, str)
    }


def _names_in(expression: str, aliases: dict[str, str]) -> set[str]:
    return {aliases.get(name.strip(), name.strip()) for name in expression.split(",") if name.strip()}


def _literal(node: ast.AST | None, constants: dict[str, Any]) -> Any:
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.Dict):
        return {
            _literal(k, constants): _literal(v, constants)
            for k, v in zip(node.keys, node.values, strict=True)
        }
    return None


class IndexQuery:
    def __init__(
        self, where: str, index: str, projection: str | None, aliases: dict[str, str], reads: set[str]
    ) -> None:
        self.where, self.index, self.projection, self.aliases, self.reads = (
            where,
            index,
            projection,
            aliases,
            reads,
        )

    @property
    def named(self) -> set[str] | None:
        return None if self.projection is None else _names_in(self.projection, self.aliases)

    def __repr__(self) -> str:
        return f"{self.where} ({self.index})"


def _string_reads(nodes: list[ast.AST]) -> set[str]:
    """String keys read off anything in these nodes: x["name"] and x.get("name")."""
    found = set()
    for root in nodes:
        for node in ast.walk(root):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
            ):
                if isinstance(node.ctx, ast.Load):
                    found.add(node.slice.value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.add(node.args[0].value)
    return found - RESPONSE_KEYS


def _python_index_queries() -> Iterator[IndexQuery]:
    constants_of_keys = _index_names()
    for folder in CODE:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            constants = dict(constants_of_keys)
            for node in tree.body:  # module-level string constants
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                    constants.update(
                        {t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)}
                    )
            top = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
            for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
                for request in _requests(function, constants):
                    # What the function reads, and what it hands the items to in this module
                    # (HeldAttempt.from_item): module-level functions and classes it names.
                    named = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)} - {function.name}
                    helpers = [top[name] for name in named if name in top]
                    yield IndexQuery(
                        f"{path.relative_to(ROOT)}:{function.name}",
                        request["IndexName"],
                        request.get("ProjectionExpression"),
                        request.get("ExpressionAttributeNames") or {},
                        _string_reads([function, *helpers]) - _request_keys(function),
                    )


def _requests(function: ast.FunctionDef, constants: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Query requests in the function that name an index: a call's keywords, or a dict literal."""
    for node in ast.walk(function):
        fields: dict[str, Any] = {}
        if isinstance(node, ast.Call) and any(k.arg == "IndexName" for k in node.keywords):
            fields = {k.arg: _literal(k.value, constants) for k in node.keywords if k.arg}
        elif isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value == "IndexName" for k in node.keys
        ):
            fields = {
                k.value: _literal(v, constants)
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant)
            }
        if fields.get("IndexName"):
            yield fields


def _request_keys(function: ast.FunctionDef) -> set[str]:
    """String subscripts the function sets or reads on its own request (kwargs["Limit"] = ...)."""
    found = set()
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.ctx, ast.Store)
        ):
            found.add(node.slice.value)
    return found | {"ExclusiveStartKey", "IndexName", "Limit"}


def _asl_index_queries() -> Iterator[IndexQuery]:
    """Query tasks of the state machines that name an index, with what their ResultSelector reads
    of the items ($.Items[0].job_id.S reads job_id)."""
    for path in sorted((ROOT / "statemachines").glob("*.asl.json")):
        for name, state in _states(json.loads(path.read_text(encoding="utf-8"))["States"]):
            parameters = state.get("Parameters") or {}
            if state.get("Type") != "Task" or "IndexName" not in parameters:
                continue
            selected = json.dumps(state.get("ResultSelector") or {})
            reads = set(re.findall(r"\$\.Items(?:\[[^\]]*\])?\.(\w+)", selected)) - RESPONSE_KEYS
            yield IndexQuery(
                f"{path.name}:{name}",
                parameters["IndexName"],
                parameters.get("ProjectionExpression"),
                parameters.get("ExpressionAttributeNames") or {},
                reads,
            )


def _states(states: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, state in states.items():
        yield name, state
        for branch in state.get("Branches", []):
            yield from _states(branch["States"])
        if "ItemProcessor" in state:
            yield from _states(state["ItemProcessor"]["States"])
        if "Iterator" in state:
            yield from _states(state["Iterator"]["States"])


def _index_queries() -> list[IndexQuery]:
    return [*_python_index_queries(), *_asl_index_queries()]


def test_every_index_the_code_queries_is_one_of_the_table():
    projected = _projected(_tables(_template())["Table"])
    queries = _index_queries()
    assert {q.index for q in queries} >= {
        "HeldAttemptsIndex",
        "WaitOrderIndex",
        "StartPendingIndex",
        "FreezeCheckIndex",
    }, queries
    assert [q for q in queries if q.index not in projected] == []


@pytest.mark.parametrize("query", _index_queries(), ids=repr)
def test_every_attribute_read_from_an_index_query_is_projected_by_that_index(query: IndexQuery):
    projected = _projected(_tables(_template())["Table"])[query.index]
    if projected is None:
        return  # ProjectionType ALL: every attribute is there
    assert query.reads <= projected, (
        f"{query}: reads {sorted(query.reads - projected)} of the items; {query.index} does not project them"
    )
    assert query.named is not None, (
        f"{query}: name what is read of {query.index} (ProjectionExpression): it projects only "
        f"{sorted(projected)}"
    )
    assert query.named <= projected, (
        f"{query}: {sorted(query.named - projected)} not projected by {query.index}"
    )
    assert query.reads <= query.named, (
        f"{query}: reads {sorted(query.reads - query.named)} of the items, beyond its ProjectionExpression"
    )


@lru_cache(maxsize=1)
def _reserved_words() -> frozenset[str]:
    # AWS's list ("Reserved words in DynamoDB", DynamoDB Developer Guide), as moto ships it.
    import moto.dynamodb.parsing.reserved_keywords as reserved

    return frozenset(reserved.ReservedKeywords.get_reserved_keywords())


@pytest.mark.parametrize("query", [q for q in _index_queries() if q.projection], ids=repr)
def test_a_projection_names_no_reserved_word_but_through_an_alias(query: IndexQuery):
    # DynamoDB refuses the whole Query ("ValidationException: ProjectionExpression: Attribute name
    # is a reserved keyword; reserved keyword: project"); a name like #project stands in for it.
    raw = {
        name.strip()
        for name in (query.projection or "").split(",")
        if name.strip() and not name.strip().startswith("#")
    }
    assert {name for name in raw if name.upper() in _reserved_words()} == set(), (
        f"{query}: alias these in ExpressionAttributeNames"
    )


def _definitions(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {index["IndexName"]: index for index in table.get("GlobalSecondaryIndexes", [])}


def index_changes(released: dict[str, Any], now: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """(added, deleted, changed in place) index names of one table."""
    before, after = _definitions(released), _definitions(now)
    added = sorted(set(after) - set(before))
    deleted = sorted(set(before) - set(after))
    changed = sorted(name for name in set(before) & set(after) if before[name] != after[name])
    return added, deleted, changed


def _released() -> dict[str, Any]:
    return json.loads(RELEASED.read_text(encoding="utf-8"))


@pytest.mark.parametrize("table", sorted(_released()["tables"]))
def test_the_template_adds_or_deletes_at_most_one_index_and_changes_none_in_place(table: str):
    released = {"GlobalSecondaryIndexes": _released()["tables"][table]}
    added, deleted, changed = index_changes(released, _tables(_template())[table])
    assert changed == [], (
        f"{table}: {changed} changed in place; AWS changes nothing of an index but its throughput: "
        "add its replacement under a new name (released_indexes.json: to_release_more_than_one_change)"
    )
    assert len(added) + len(deleted) <= 1, (
        f"{table}: {added} added and {deleted} deleted since {_released()['released_at']}; one update "
        "creates or deletes one "
        "index (released_indexes.json: to_release_more_than_one_change)"
    )


def test_a_projection_edited_in_place_or_two_indexes_at_once_are_refused():
    """The rule itself, on the release: the fix that looks obvious (journal_id added to
    HeldByIndex) is a change in place; a replacement plus the old one's deletion is two changes."""
    released = {"GlobalSecondaryIndexes": _released()["tables"]["Table"]}
    edited = json.loads(json.dumps(released))
    held = next(index for index in edited["GlobalSecondaryIndexes"] if index["IndexName"] == "HeldByIndex")
    held["Projection"]["NonKeyAttributes"].append("journal_id")
    assert index_changes(released, edited) == ([], [], ["HeldByIndex"])
    replaced = json.loads(json.dumps(edited))
    held = next(index for index in replaced["GlobalSecondaryIndexes"] if index["IndexName"] == "HeldByIndex")
    held["IndexName"] = "HeldAttemptsIndex"
    added, deleted, changed = index_changes(released, replaced)
    assert (added, deleted, changed) == (["HeldAttemptsIndex"], ["HeldByIndex"], [])
