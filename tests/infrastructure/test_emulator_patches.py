"""The emulator's patches over moto: all in relevo_local/moto, each naming the moto release it was
verified against, all applied by one install() that first refuses any other release, each listed
in docs/emulator.md with a test that exists (issues 17 and 31); then, patch by patch, that it
changes what it says and nothing else.

Given the emulator's modules, when their assignments are read from source, then only the modules
of relevo_local/moto assign anything onto moto's modules or classes.
"""

from __future__ import annotations

import ast
import copy
import json
import random
import re
import subprocess
import sys
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "local" / "relevo_local"
PATCHES = LOCAL / "moto"
CATALOGUE = ROOT / "docs" / "emulator.md"
# Patches applied to the running emulator's state, by the stack, rather than installed.
APPLIED_TO_THE_RUNNING_EMULATOR = {"point_api_url_output_at_the_adapter", "detach_emulator_stream_invoker"}
UNVERIFIED = "5.3.0"
REFUSAL = (
    f"relevo local: moto {UNVERIFIED} is installed; the emulator's patches were verified against moto 5.2.5 "
    "(pip install 'moto[server]==5.2.5')"
)


def _moto_names(tree: ast.AST) -> set[str]:
    """Names bound to something imported from moto in this module (at any depth)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("moto"):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(
                (alias.asname or alias.name).split(".")[0]
                for alias in node.names
                if alias.name.startswith("moto")
            )
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _assignments_onto_moto(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    moto = _moto_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AugAssign)
            else []
        )
        for target in targets:
            if isinstance(target, ast.Attribute) and _root(target) in moto:
                found.append(f"{path.relative_to(LOCAL)}:{node.lineno} assigns {ast.unparse(target)}")
    return found


def _imports_moto(function: ast.FunctionDef) -> bool:
    return any(
        (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "moto")
        or (isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "moto" for alias in node.names))
        for node in ast.walk(function)
    )


def _patch_functions() -> dict[str, ast.FunctionDef]:
    """Every patch: a public function of a relevo_local.moto module that reaches into moto."""
    found = {}
    for path in sorted(PATCHES.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and _imports_moto(node):
                found[node.name] = node
    return found


def test_only_the_moto_package_changes_moto() -> None:
    elsewhere = [
        p
        for path in sorted(LOCAL.rglob("*.py"))
        if not path.is_relative_to(PATCHES)
        for p in _assignments_onto_moto(path)
    ]
    assert elsewhere == [], "move these into a module of local/relevo_local/moto:\n" + "\n".join(elsewhere)


def test_each_patch_names_the_moto_release_it_was_verified_against() -> None:
    from relevo_local.moto import VERIFIED_MOTO

    undated = [
        name
        for name, node in _patch_functions().items()
        if f"moto {VERIFIED_MOTO}" not in (ast.get_docstring(node) or "")
    ]
    assert undated == []


def test_install_applies_every_patch() -> None:
    tree = ast.parse((PATCHES / "__init__.py").read_text(encoding="utf-8"))
    install = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "install")
    called = {
        node.func.attr
        for node in ast.walk(install)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert set(_patch_functions()) - APPLIED_TO_THE_RUNNING_EMULATOR == called - {"check_moto_version"}


def test_every_patch_is_catalogued_with_a_test_that_exists() -> None:
    catalogue = CATALOGUE.read_text(encoding="utf-8")
    missing = sorted(name for name in _patch_functions() if f"`{name}`" not in catalogue)
    assert missing == [], f"docs/emulator.md does not list: {missing}"
    named = re.findall(r"(tests/[\w/]+\.py)::(test_\w+)", catalogue)
    assert named
    absent = [
        f"{path}::{test}"
        for path, test in named
        if not (ROOT / path).is_file()
        or not re.search(rf"^(async )?def {test}\(", (ROOT / path).read_text(encoding="utf-8"), re.M)
    ]
    assert absent == [], f"docs/emulator.md names tests that do not exist: {absent}"


def test_install_refuses_an_unverified_moto_in_one_line_and_patches_nothing() -> None:
    """In a fresh interpreter, moto's version faked (nothing installed): install() raises one line
    before it imports a single moto module, so no patch can have been applied."""
    script = f"""
import sys
from importlib import metadata
version = metadata.version
metadata.version = lambda name: {UNVERIFIED!r} if name == "moto" else version(name)
from relevo_local import moto as patches
from relevo_local.identity import RoleSessions
try:
    patches.install(RoleSessions("eu-west-1"))
except patches.UnverifiedMoto as refused:
    print(refused)
print(sorted(name for name in sys.modules if name == "moto" or name.startswith("moto.")))
"""
    shown = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert shown.splitlines() == [REFUSAL, "[]"]


def test_relevo_local_declares_exactly_the_moto_its_gate_accepts() -> None:
    """local/pyproject.toml's moto requirement admits the one release check_moto_version lets
    through and no other: `~=5.2.5` would let pip install a 5.2.6 the emulator then refuses."""
    import tomllib

    from packaging.requirements import Requirement

    from relevo_local.moto import VERIFIED_MOTO

    declared = tomllib.loads((ROOT / "local" / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "dependencies"
    ]
    [moto] = [Requirement(line) for line in declared if Requirement(line).name == "moto"]
    assert "server" in moto.extras
    assert [(spec.operator, spec.version) for spec in moto.specifier] == [("==", VERIFIED_MOTO)]
    major, minor, patch = (int(part) for part in VERIFIED_MOTO.split("."))
    for other in (
        f"{major}.{minor}.{patch + 1}",
        f"{major}.{minor + 1}.0",
        f"{major}.{minor}.{patch - 1}" if patch else "0.0.1",
    ):
        assert not moto.specifier.contains(other), other
    assert moto.specifier.contains(VERIFIED_MOTO)


def test_relevo_local_up_refuses_an_unverified_moto_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from relevo_cli.main import app
    from relevo_local import moto as patches

    version = patches.metadata.version
    monkeypatch.setattr(
        patches.metadata, "version", lambda name: UNVERIFIED if name == "moto" else version(name)
    )
    shown = CliRunner().invoke(app, ["local", "up", "--state-dir", str(tmp_path)])
    assert (shown.exit_code, shown.output.strip()) == (2, REFUSAL)
    assert not (tmp_path / "local-up.lock").exists()  # refused before it took the state dir


def test_a_state_machine_definition_is_parsed_once_and_a_bad_one_is_refused_each_time() -> None:
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser, ASLParserException

    from relevo_local.moto.stepfunctions import parse_each_state_machine_definition_once

    parse_each_state_machine_definition_once()
    parse_each_state_machine_definition_once()  # idempotent
    definition = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})
    first, second = AmazonStateLanguageParser.parse(definition), AmazonStateLanguageParser.parse(definition)
    assert first[1] is second[1]  # one syntax tree per text
    assert first[0] is not second[0]  # a program of its own for each execution
    for _ in range(2):
        with pytest.raises(ASLParserException):
            AmazonStateLanguageParser.parse('{"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": ')


def test_no_value_is_dropped_from_a_list_as_cloudformation_does() -> None:
    import moto.cloudformation.parsing as parsing

    from relevo_local.moto.cloudformation import drop_no_value_from_lists

    drop_no_value_from_lists()
    drop_no_value_from_lists()  # idempotent
    resources = {"AWS::NoValue": None}  # what moto's ResourceMap resolves the pseudo parameter to
    statements = [{"Effect": "Allow"}, {"Ref": "AWS::NoValue"}, "kept"]
    assert parsing.clean_json(statements, resources) == [{"Effect": "Allow"}, "kept"]
    assert parsing.clean_json({"a": {"Ref": "AWS::NoValue"}, "b": 1}, resources) == {"b": 1}  # maps as before


def test_a_managed_policy_answers_its_arn_and_id_as_cloudformation_does() -> None:
    from moto.cloudformation.exceptions import UnformattedGetAttTemplateException
    from moto.iam.models import ManagedPolicy

    from relevo_local.moto.cloudformation import answer_managed_policy_attributes

    answer_managed_policy_attributes()
    answer_managed_policy_attributes()  # idempotent
    policy = ManagedPolicy(
        "agent-policy",
        account_id="123456789012",
        region="us-east-1",
        default_version_id="v1",
        document=json.dumps({"Version": "2012-10-17", "Statement": []}),
    )
    assert ManagedPolicy.has_cfn_attr("PolicyArn") and ManagedPolicy.has_cfn_attr("PolicyId")
    assert (
        policy.get_cfn_attribute("PolicyArn") == policy.arn == "arn:aws:iam::123456789012:policy/agent-policy"
    )
    assert policy.get_cfn_attribute("PolicyId") == policy.id
    with pytest.raises(UnformattedGetAttTemplateException):
        policy.get_cfn_attribute("Nothing")


def test_a_json_path_is_parsed_once_and_still_finds_what_it_names() -> None:
    from moto.stepfunctions.parser.asl.utils import json_path

    from relevo_local.moto.stepfunctions import parse_each_json_path_once

    parse_each_json_path_once()
    parse_each_json_path_once()  # idempotent: one cache, not a cache of a cache
    assert json_path.parse("$.job.stages[0]") is json_path.parse("$.job.stages[0]")
    data = {"job": {"stages": ["build", "sign"]}}
    assert json_path.extract_json("$.job.stages[1]", data) == "sign"
    assert json_path.extract_json("$.job.stages[0]", data) == "build"


def test_an_update_expression_is_parsed_once_and_a_bad_one_is_refused_each_time() -> None:
    from moto.dynamodb.exceptions import InvalidUpdateExpression
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    from relevo_local.moto.dynamodb import parse_each_update_expression_once

    parse_each_update_expression_once()
    parse_each_update_expression_once()  # idempotent
    text = "SET #status = :running, lease_expires_at = :lease REMOVE exit_code"
    tree = UpdateExpressionParser.make(text)
    assert UpdateExpressionParser.make(text) is tree
    assert {c.get_value_name() for c in tree.find_clauses([_attribute_value_class()])} == {
        ":running",
        ":lease",
    }
    for _ in range(2):
        with pytest.raises(InvalidUpdateExpression):
            UpdateExpressionParser.make("SET = :nothing")


def test_an_update_expressions_form_is_checked_until_it_passes_once_and_the_item_is_still_checked_every_time() -> (
    None
):
    from moto.dynamodb.exceptions import DuplicateUpdateExpression, MockValidationException
    from moto.dynamodb.models.dynamo_type import DynamoType, Item
    from moto.dynamodb.parsing import validators
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    from relevo_local.moto.dynamodb import (
        check_each_update_expressions_form_once,
        parse_each_update_expression_once,
    )

    parse_each_update_expression_once()
    check_each_update_expressions_form_once()
    check_each_update_expressions_form_once()  # idempotent

    class Table:
        table_key_attrs = ["pk"]
        attribute_keys = ["pk"]
        attr = []

    def validator(text: str, values: dict, names: dict | None = None) -> validators.UpdateExpressionValidator:
        item = Item(DynamoType({"S": "k"}), None, attrs={"pk": {"S": "k"}, "n": {"N": "1"}})
        return validators.UpdateExpressionValidator(
            UpdateExpressionParser.make(text), names or {}, values, item, Table()
        )

    form_checks = (validators.ActionCountValidator, validators.OverlappingPathsValidator)
    twice = "SET #a = :x, #a = :y"
    for _ in range(2):  # refused each time: a failed form is never remembered
        with pytest.raises(DuplicateUpdateExpression):
            validator(twice, {":x": {"S": "1"}, ":y": {"S": "2"}}, {"#a": "a"}).validate()

    text = "SET #a = :x REMOVE gone"
    first = validator(text, {":x": {"S": "1"}}, {"#a": "a"})
    assert any(isinstance(p, form_checks) for p in first.processors)
    first.validate()
    again = validator(text, {":x": {"S": "2"}}, {"#a": "a"})
    assert not any(isinstance(p, form_checks) for p in again.processors)
    again.validate()
    # Other names: a form of its own, checked again.
    assert any(
        isinstance(p, form_checks) for p in validator(text, {":x": {"S": "1"}}, {"#a": "b"}).processors
    )
    # The item and the values are still checked on every use of a remembered form.
    with pytest.raises(MockValidationException):
        validator(text, {}, {"#a": "a"}).validate()  # :x not given


def test_an_update_expression_validates_and_applies_as_moto_walks_it_with_each_passes_node_types_found_once() -> (
    None
):
    """traverse_expression_trees_by_node_type against moto's own walk (each pass's processing map
    built and isinstance asked at every node): the same items after each expression (SET with
    arithmetic, if_not_exists, list_append, nested paths, REMOVE, ADD, DELETE) and the same error
    for each refused one (a path that does not exist, a key attribute set, an empty key, a type
    mismatch, two actions of a kind); the patched pass runs no processing map at a node it
    already knows."""
    from moto.dynamodb.models.dynamo_type import DynamoType, Item
    from moto.dynamodb.parsing import ast_nodes, validators
    from moto.dynamodb.parsing.executors import UpdateExpressionExecutor
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    from relevo_local.moto.dynamodb import traverse_expression_trees_by_node_type

    traverse_expression_trees_by_node_type()
    traverse_expression_trees_by_node_type()  # idempotent
    traverser = ast_nodes.DepthFirstTraverser
    patched = traverser.traverse_node_recursively

    def moto_walk(self: Any, node: Any, child_id: int = -1) -> Any:
        # moto 5.2.5's DepthFirstTraverser.traverse_node_recursively, as it reads.
        if isinstance(node, ast_nodes.Node):
            parent_node = node.parent
            if node.children is not None:
                for i, child_node in enumerate(node.children):
                    self.pre_processing_of_child(node, i)
                    self.traverse_node_recursively(child_node, i)
            if isinstance(node, self.nodes_to_be_processed()):
                node = self.process(node)
                node.parent = parent_node
                if parent_node:
                    parent_node.children[child_id] = node
        return node

    class Table:
        table_key_attrs = ["pk", "sk"]
        attribute_keys = ["pk", "sk"]
        attr = [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}]

    values = {
        ":one": {"N": "1"},
        ":s": {"S": "x"},
        ":empty": {"S": ""},
        ":list": {"L": [{"S": "a"}]},
        ":set": {"SS": ["b"]},
        ":map": {"M": {"k": {"N": "3"}}},
        ":zero": {"N": "0"},
    }
    names = {"#status": "status", "#n": "count"}
    expressions = [
        "SET #status = :s, #n = if_not_exists(#n, :zero) + :one",
        "SET tags = list_append(if_not_exists(tags, :list), :list), m.k = :one REMOVE gone, other",
        "SET m.inner = :map, lst[0] = :s",
        "ADD #n :one, strs :set",
        "DELETE strs :set",
        "SET nums = nums - :one",
        "SET missing.deep = :s",  # a path under an attribute that does not exist
        "SET pk = :s",  # a key attribute
        "SET sk = :empty",
        "SET nums = :s + :one",  # arithmetic on a string
        "SET a = :s SET b = :s",  # two SET clauses
        "SET a = :s, a = :one",  # one path twice
        "REMOVE lst[0], m.k",
    ]

    def applied(text: str, walk: Any) -> Any:
        traverser.traverse_node_recursively = walk
        # moto's own copy of the tree with moto's own walk (copy_expression_trees_node_by_node's is
        # pinned in its own test).
        validators.deepcopy = own_copy if walk is patched else copy.deepcopy
        try:
            attrs = {
                "pk": {"S": "k"},
                "sk": {"S": "r"},
                "nums": {"N": "5"},
                "strs": {"SS": ["a", "b"]},
                "m": {"M": {"k": {"N": "1"}}},
                "lst": {"L": [{"S": "z"}]},
                "gone": {"S": "g"},
                "other": {"S": "o"},
            }
            item = Item(DynamoType({"S": "k"}), DynamoType({"S": "r"}), attrs=attrs)
            used = {k: v for k, v in values.items() if k in text}
            tree = validators.UpdateExpressionValidator(
                UpdateExpressionParser.make(text),
                {k: v for k, v in names.items() if k in text},
                used,
                item,
                Table(),
            ).validate()
            UpdateExpressionExecutor(tree, item, names).execute()
            return item.to_json()
        except Exception as refused:  # noqa: BLE001 (the refusal is what is compared)
            return (type(refused).__name__, str(refused))
        finally:
            traverser.traverse_node_recursively = patched
            validators.deepcopy = own_copy

    own_copy = validators.deepcopy
    outcomes = []
    for text in expressions:
        ours, moto_own = applied(text, patched), applied(text, moto_walk)
        assert ours == moto_own, text
        outcomes.append(ours)
    assert sum(isinstance(outcome, tuple) for outcome in outcomes) >= 5  # the refused ones were refused
    maps = 0
    processing_map = validators.ExecuteOperations._processing_map

    def counted(self: Any) -> Any:
        nonlocal maps
        maps += 1
        return processing_map(self)

    validators.ExecuteOperations._processing_map = counted
    try:
        applied("SET #status = :s, #n = if_not_exists(#n, :zero) + :one", patched)
    finally:
        validators.ExecuteOperations._processing_map = processing_map
    assert maps <= 3, maps  # once per node processed, not at every node


def test_an_expression_tree_is_copied_as_deepcopy_copies_it_node_by_node() -> None:
    """copy_expression_trees_node_by_node against copy.deepcopy on parsed UpdateExpressions (with
    the parents the validators set): the same tree, node for node and value for value, no node
    shared with the original, each copied parent the parent of its copied children; a value
    that is not a node (a DynamoType) is copied by its own __deepcopy__."""
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.parsing import ast_nodes, validators
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    from relevo_local.moto.dynamodb import copy_expression_trees_node_by_node

    copy_expression_trees_node_by_node()
    copy_expression_trees_node_by_node()  # idempotent

    def shape(node: Any, seen: set[int]) -> Any:
        if isinstance(node, ast_nodes.Node):
            assert id(node) not in seen
            seen.add(id(node))
            fields = {
                name: (shape(value, seen) if name != "parent" else type(value).__name__)
                for name, value in vars(node).items()
            }
            for child in node.children or []:
                if isinstance(child, ast_nodes.Node) and child.parent is not None:
                    assert child.parent is node
            return (type(node).__name__, fields)
        if isinstance(node, list):
            return [shape(element, seen) for element in node]
        if isinstance(node, DynamoType):
            return ("DynamoType", node.type, repr(node.value))
        return node

    for text in (
        "SET #status = :s, #n = if_not_exists(#n, :zero) + :one REMOVE gone, other",
        "SET tags = list_append(if_not_exists(tags, :list), :list), m.k[2].x = :one",
        "ADD #n :one, strs :set DELETE more :set",
    ):
        tree = UpdateExpressionParser.make(text)
        for node in _nodes(tree):
            for child in node.children or []:
                if isinstance(child, ast_nodes.Node):
                    child.parent = node
        ours, theirs = validators.deepcopy(tree), copy.deepcopy(tree)
        assert shape(ours, set()) == shape(theirs, set())
        assert not {id(node) for node in _nodes(ours)} & {id(node) for node in _nodes(tree)}
    value = DynamoType({"L": [{"S": "a"}]})
    copied = validators.deepcopy(value)
    assert copied == value and copied is not value and copied.value is not value.value


def _nodes(tree: Any) -> list[Any]:
    from moto.dynamodb.parsing import ast_nodes

    found, pending = [], [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast_nodes.Node):
            found.append(node)
            pending.extend(node.children or [])
    return found


def test_a_tables_query_reads_its_partition_only_and_answers_as_moto_does() -> None:
    """query_a_tables_partition_only against moto's own listing of the whole table: on a table of
    many partitions (string and number hash keys, a number written two ways), every query (range
    conditions, limit and start key, backwards, a filter, a projection, an empty partition, an
    index) answers the same items in the same order with the same counts and last key; a table's
    Query lists its partition only, an index's Query and a Scan the whole table."""
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    from relevo_local.moto.dynamodb import query_a_tables_partition_only

    query_a_tables_partition_only()
    query_a_tables_partition_only()  # idempotent
    backend = DynamoDBBackend("us-east-1", "123456789012")

    def table(name: str, hash_type: str) -> Table:
        return backend.create_table(
            name,
            schema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            throughput=None,
            attr=[
                {"AttributeName": "pk", "AttributeType": hash_type},
                {"AttributeName": "sk", "AttributeType": "S"},
                {"AttributeName": "g", "AttributeType": "S"},
            ],
            global_indexes=[
                {
                    "IndexName": "by-g",
                    "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "ALL"},
                }
            ],
            indexes=None,
            streams=None,
            billing_mode="PAY_PER_REQUEST",
            sse_specification=None,
            tags=[],
            deletion_protection_enabled=None,
            warm_throughput=None,
        )

    strings, numbers = table("strings", "S"), table("numbers", "N")
    for p in range(40):
        for r in range(6):
            attrs = {"sk": {"S": f"{r:02d}"}, "g": {"S": f"g{(p + r) % 3}"}, "n": {"N": str(r)}}
            strings.put_item({"pk": {"S": f"JOB#{p:03d}"}, **attrs})
            numbers.put_item({"pk": {"N": str(p)}, **attrs})
    numbers.put_item(
        {"pk": {"N": "7.0"}, "sk": {"S": "99"}, "g": {"S": "g0"}}
    )  # the partition of 7, written 7.0

    moto_listing = Table._relevo_original_all_items

    def answered(target: Table, hash_value: dict, **options: object) -> object:
        arguments = dict(
            range_comparison=None,
            range_objs=[],
            limit=None,
            exclusive_start_key=None,
            scan_index_forward=True,
            projection_expressions=None,
        )
        arguments.update(options)
        items, scanned, last = target.query(DynamoType(hash_value) if hash_value else None, **arguments)
        return [item.to_json() for item in items], scanned, last

    def both(target: Table, hash_value: dict, **options: object) -> object:
        ours = answered(target, hash_value, **options)
        original = Table.all_items
        Table.all_items = moto_listing  # moto's own: the whole table, every time
        try:
            assert answered(target, hash_value, **options) == ours, (hash_value, options)
        finally:
            Table.all_items = original
        return ours

    cases = [
        (strings, {"S": "JOB#007"}, {}),
        (
            strings,
            {"S": "JOB#007"},
            {"range_comparison": "BETWEEN", "range_objs": [DynamoType({"S": "01"}), DynamoType({"S": "04"})]},
        ),
        (
            strings,
            {"S": "JOB#007"},
            {"limit": 2, "exclusive_start_key": {"pk": {"S": "JOB#007"}, "sk": {"S": "01"}}},
        ),
        (strings, {"S": "JOB#007"}, {"scan_index_forward": False, "limit": 3}),
        (strings, {"S": "JOB#007"}, {"projection_expressions": [["n"]]}),
        (strings, {"S": "JOB#999"}, {}),
        (numbers, {"N": "7"}, {}),
        (numbers, {"N": "7.00"}, {"range_comparison": "BEGINS_WITH", "range_objs": [DynamoType({"S": "9"})]}),
    ]
    for target, hash_value, options in cases:
        both(target, hash_value, **options)
    assert len(both(numbers, {"N": "7"})[0]) == 7  # 7 and 7.0 are one partition

    # What the whole-table listing is asked for: the index's Query and the Scan, not the table's Query.
    patched_all_items = Table.all_items
    seen: list[int] = []

    def watched(self: Table) -> object:
        listed = patched_all_items(self)
        seen.append(len(listed))
        return listed

    Table.all_items = watched
    try:
        answered(strings, {"S": "JOB#007"})
        answered(strings, {"S": "g1"}, index_name="by-g")
        strings.scan(
            filters={},
            limit=None,
            exclusive_start_key=None,
            filter_expression=None,
            index_name=None,
            consistent_read=False,
            projection_expression=None,
        )
    finally:
        Table.all_items = patched_all_items
    assert seen[0] == 6 and seen[1] == 240 and seen[2] == 240, seen


def _attribute_value_class() -> type:
    from moto.dynamodb.parsing.ast_nodes import ExpressionAttributeValue

    return ExpressionAttributeValue


def test_an_answer_of_plain_dicts_serializes_byte_for_byte_as_moto_would_with_each_members_keys_found_once() -> (
    None
):
    """The memo of pick_members_of_plain_answers_once against moto's own walk, on a Query answer
    holding every AttributeValue type, nested maps and lists, and a DescribeTable answer."""
    from datetime import datetime

    from moto.core import serialize
    from moto.core.utils import get_service_model

    from relevo_local.moto.server import pick_members_of_plain_answers_once

    pick_members_of_plain_answers_once()
    item = {
        "pk": {"S": "JOB#j1"},
        "n": {"N": "12.5"},
        "b": {"B": "AAEC"},
        "ss": {"SS": ["a", "b"]},
        "ns": {"NS": ["1", "2"]},
        "bs": {"BS": ["AAE="]},
        "null": {"NULL": True},
        "flag": {"BOOL": False},
        "m": {
            "M": {
                "inner": {"L": [{"S": "x"}, {"M": {"deep": {"N": "3"}}}]},
                "dict_like": {"S": "key starts with dict"},
            }
        },
    }
    answers = {
        "Query": {
            "Items": [item, item],
            "Count": 2,
            "ScannedCount": 2,
            "LastEvaluatedKey": {"pk": {"S": "JOB#j1"}},
        },
        "DescribeTable": {
            "Table": {
                "TableName": "t",
                "TableStatus": "ACTIVE",
                "CreationDateTime": datetime(2026, 12, 3, tzinfo=UTC),
                "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
                "ItemCount": 3,
            }
        },
    }
    service = get_service_model("dynamodb")
    picker = serialize.XFormedAttributePicker

    def serialized(operation: str) -> bytes:
        serializer = serialize.get_serializer_class("dynamodb", "json")(
            operation_model=service.operation_model(operation), value_picker=picker()
        )
        return serializer.serialize(answers[operation])["body"]

    for operation in answers:
        memoized = serialized(operation)
        assert serialized(operation) == memoized  # from the memo this time
        patched = picker.get_possible_keys
        picker.get_possible_keys = picker._relevo_original_get_possible_keys
        try:
            assert serialized(operation) == memoized, operation
        finally:
            picker.get_possible_keys = patched
    # What is not a blob comes back as it went in (moto's serializer encodes B and BS values itself).
    assert {k: v for k, v in json.loads(serialized("Query"))["Items"][0].items() if k not in ("b", "bs")} == {
        k: v for k, v in item.items() if k not in ("b", "bs")
    }


def _attribute_value(draw: random.Random, depth: int = 0) -> dict[str, Any]:
    """One AttributeValue as moto answers with it: every type, maps and lists nested, blobs as
    bytes (what moto's request parser stores) and as text."""
    kinds = ["S", "N", "B", "SS", "NS", "BS", "NULL", "BOOL"] + (["M", "L"] if depth < 3 else [])
    kind = draw.choice(kinds)
    values: dict[str, Any] = {
        "S": lambda: draw.choice(["", "x", "ünïcödé", "a" * 64]),
        "N": lambda: draw.choice(["1", "-2.5", "1E+10"]),
        "B": lambda: draw.choice([b"\x00\x01", b"", "AAEC"]),
        "SS": lambda: ["a", "b"],
        "NS": lambda: ["1", "2"],
        "BS": lambda: [b"\x01", "AAE="],
        "NULL": lambda: True,
        "BOOL": lambda: draw.choice([True, False]),
        "M": lambda: {f"k{i}": _attribute_value(draw, depth + 1) for i in range(draw.randint(0, 4))},
        "L": lambda: [_attribute_value(draw, depth + 1) for _ in range(draw.randint(0, 4))],
    }
    return {kind: values[kind]()}


def test_attribute_values_serialize_byte_for_byte_as_moto_walks_them_without_the_walk() -> None:
    """serialize_attribute_values_directly against moto's own walk: 200 rounds of answers of the
    item operations (every AttributeValue type, nested maps and lists, blobs, capacity, keys),
    each body identical byte for byte; a dict with a key that is no AttributeValue member still
    takes moto's walk; and the direct way does not call moto's structure walk for an attribute value."""
    from moto.core import serialize
    from moto.core.utils import get_service_model

    from relevo_local.moto.server import (
        pick_members_of_plain_answers_once,
        serialize_attribute_values_directly,
    )

    pick_members_of_plain_answers_once()
    serialize_attribute_values_directly()
    serialize_attribute_values_directly()  # idempotent
    json_serializer = serialize.BaseJSONSerializer
    service = get_service_model("dynamodb")
    draw = random.Random(29)

    def item() -> dict[str, Any]:
        return {f"a{i}": _attribute_value(draw) for i in range(draw.randint(1, 12))}

    def body(operation: str, answer: dict[str, Any]) -> str:
        serializer = serialize.get_serializer_class("dynamodb", "json")(
            operation_model=service.operation_model(operation),
            value_picker=serialize.XFormedAttributePicker(),
        )
        return serializer.serialize(answer)["body"]

    def walked(operation: str, answer: dict[str, Any]) -> str:
        direct = json_serializer._serialize_type_structure
        json_serializer._serialize_type_structure = json_serializer._relevo_original_serialize_type_structure
        try:
            return body(operation, answer)
        finally:
            json_serializer._serialize_type_structure = direct

    for _ in range(200):
        answers = {
            "Query": {
                "Items": [item(), item()],
                "Count": 2,
                "ScannedCount": 2,
                "LastEvaluatedKey": item(),
                "ConsumedCapacity": {"TableName": "t", "CapacityUnits": 1.5, "Table": {"CapacityUnits": 1.5}},
            },
            "GetItem": {"Item": item()},
            "UpdateItem": {"Attributes": item()},
            "TransactGetItems": {"Responses": [{"Item": item()}, {}]},
            "BatchGetItem": {"Responses": {"t": [item(), item()]}, "UnprocessedKeys": {}},
            "TransactWriteItems": {
                "ItemCollectionMetrics": {
                    "t": [{"ItemCollectionKey": item(), "SizeEstimateRangeGB": [0.0, 1.0]}]
                }
            },
        }
        for operation, answer in answers.items():
            assert body(operation, answer) == walked(operation, answer), operation
    # A key no AttributeValue has (here the snake_case one moto's picker would also find): moto's walk.
    odd = {"Item": {"a": {"s": "lower"}, "b": {"S": "x", "extra": 1}}}
    assert body("GetItem", odd) == walked("GetItem", odd)
    # moto's walk of a structure ends in ResponseSerializer's (BaseJSONSerializer's calls it through super()).
    walks: list[str] = []
    original = serialize.ResponseSerializer._serialize_type_structure

    def counting(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        walks.append(shape.name)
        original(self, serialized, value, shape, key)

    serialize.ResponseSerializer._serialize_type_structure = counting
    try:
        body("GetItem", {"Item": item()})
    finally:
        serialize.ResponseSerializer._serialize_type_structure = original
    assert "AttributeValue" not in walks and walks == ["GetItemOutput"]


def test_a_heartbeat_before_the_tasks_wait_is_taken_as_on_aws() -> None:
    """moto 5.2.5 answered InvalidToken to a heartbeat sent after AwaitResult wrote the run token
    but before its wait began (seen in the suite under load: agent_runs failed at its first
    SendTaskHeartbeat). The token is live from the task's start on AWS."""
    from moto.stepfunctions.parser.asl.eval.callback.callback import (
        CallbackOutcomeSuccess,
        CallbackPoolManager,
    )

    from relevo_local.moto import stepfunctions

    stepfunctions.take_the_token_before_the_wait()
    pool = CallbackPoolManager(activity_store={})
    endpoint = pool.add("token-1")
    assert pool.heartbeat("token-1")  # before the wait: taken (unpatched: False, then InvalidToken)
    assert not pool.heartbeat("no-such-token")
    heartbeats = endpoint.setup_heartbeat_endpoint(heartbeat_seconds=1)
    assert pool.heartbeat("token-1") and heartbeats.clear_and_wait()  # during the wait: resets the clock
    pool.notify("token-1", CallbackOutcomeSuccess(callback_id="token-1", output="{}"))
    assert endpoint.get_outcome() is not None


def test_an_answer_before_the_tasks_wait_ends_the_wait_as_on_aws() -> None:
    """moto 5.2.5 lost SendTaskFailure sent after AwaitResult wrote the run token but before its
    heartbeat clock was set up: the wait heard no heartbeat, ended States.HeartbeatTimeout, and the
    stage was retried as a lost lease (seen in CI: the dead-letter test's execution stayed RUNNING
    at its second dispatch). On AWS the token takes the answer from the task's start."""
    from moto.stepfunctions.parser.asl.eval.callback.callback import (
        CallbackOutcomeFailure,
        CallbackPoolManager,
    )

    from relevo_local.moto import stepfunctions

    stepfunctions.take_the_token_before_the_wait()
    pool = CallbackPoolManager(activity_store={})
    endpoint = pool.add("token-3")
    assert pool.notify(
        "token-3",
        CallbackOutcomeFailure(callback_id="token-3", error="Relevo.Fatal.ExitCode", cause="exit 1"),
    )
    heartbeats = endpoint.setup_heartbeat_endpoint(heartbeat_seconds=5)  # the wait begins after the answer
    assert heartbeats.clear_and_wait()  # woken at once (unpatched: 5 s, then False: a heartbeat timeout)
    assert endpoint.get_outcome().error == "Relevo.Fatal.ExitCode"


def test_an_answer_to_a_task_whose_wait_ended_is_refused_as_on_aws() -> None:
    """moto 5.2.5 took SendTaskSuccess for a callback task that had timed out (its endpoint stays
    in the pool), so an agent answering a queue wait that had run out was told its claim was
    taken. AWS refuses it with TaskTimedOut."""
    from moto.stepfunctions.parser.asl.eval.callback.callback import (
        CallbackNotifyConsumerError,
        CallbackOutcomeSuccess,
        CallbackPoolManager,
    )

    from relevo_local.moto import stepfunctions

    stepfunctions.take_the_token_before_the_wait()
    stepfunctions.close_a_callback_when_its_wait_ends()
    pool = CallbackPoolManager(activity_store={})
    endpoint = pool.add("token-2")
    endpoint.wait(timeout=0.01)  # the task's wait runs out with no answer
    endpoint.interrupt_all()  # what the interpreter does when a task's wait ends, whatever ended it
    for answer in (
        lambda: pool.notify("token-2", CallbackOutcomeSuccess(callback_id="token-2", output="{}")),
        lambda: pool.heartbeat("token-2"),
    ):
        with pytest.raises(CallbackNotifyConsumerError):  # the provider answers TaskTimedOut
            answer()
    # which the server can now send (unpatched: TypeError, an HTTP 500)
    from moto.stepfunctions.parser.api import TaskTimedOut

    error = TaskTimedOut()
    assert (error.error_type, error.code) == (
        "TaskTimedOut",
        400,
    ) and "does not exist anymore" in error.message


def test_the_cause_of_a_task_failure_reaches_the_interpreter_as_on_aws() -> None:
    """moto 5.2.5's SendTaskFailure endpoint read only `error`: a callback task's catcher got an
    empty Cause, and a job's error said "no cause was reported" where the agent had said why.
    AWS passes the cause on (SendTaskFailure, Step Functions API Reference)."""
    from moto.stepfunctions.responses import StepFunctionResponse

    from relevo_local.moto import stepfunctions

    stepfunctions.pass_on_the_cause_of_a_task_failure()
    told: dict[str, object] = {}

    class Backend:
        def send_task_failure(
            self, task_token: str, error: str | None = None, cause: str | None = None
        ) -> None:
            told.update(token=task_token, error=error, cause=cause)

    class Endpoint(StepFunctionResponse):
        stepfunction_backend = property(lambda self: Backend())  # type: ignore[assignment]  # a stand-in

    response = Endpoint.__new__(Endpoint)
    params = {"taskToken": "t-1", "error": "Relevo.Fatal.Checkout", "cause": '{"why": "no such commit"}'}
    response._get_param = params.get  # type: ignore[method-assign]  # the request's parameters
    response.send_task_failure()
    assert told == {"token": "t-1", "error": "Relevo.Fatal.Checkout", "cause": '{"why": "no such commit"}'}


def test_moto_lists_its_modules_once_and_still_finds_a_service_by_its_name() -> None:
    from moto import backends
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    from relevo_local.moto.server import list_moto_modules_once

    list_moto_modules_once()
    list_moto_modules_once()  # idempotent
    assert backends.list_of_moto_modules() is backends.list_of_moto_modules()
    assert {"dynamodb", "stepfunctions", "sqs"} <= set(backends.list_of_moto_modules())
    dispatcher = DomainDispatcherApplication(create_app=lambda service: None)
    assert dispatcher.get_backend_for_host("dynamodb") == "dynamodb"
