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


def test_a_state_machine_parsed_once_is_the_program_moto_parses_each_time() -> None:
    """parse_each_state_machine_definition_once against moto's own parse, on a definition of the
    kinds of state job.asl.json has (its own takes moto seconds to parse): the same syntax tree,
    token for token, and a program of the same states, each of the same kind."""
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    from relevo_local.moto.stepfunctions import parse_each_state_machine_definition_once

    parse_each_state_machine_definition_once()
    update = "arn:aws:states:::dynamodb:updateItem"
    definition = json.dumps(
        {
            "StartAt": "Mark",
            "States": {
                "Mark": {
                    "Type": "Task",
                    "Resource": update,
                    "Parameters": {"TableName": "t", "Key": {"pk": {"S.$": "$.job_id"}}},
                    "ResultPath": None,
                    "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Failed"}],
                    "Next": "Await",
                },
                "Await": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                    "Parameters": {"QueueUrl": "q", "MessageBody": {"token.$": "$$.Task.Token"}},
                    "HeartbeatSeconds": 30,
                    "Retry": [{"ErrorEquals": ["States.HeartbeatTimeout"], "MaxAttempts": 2}],
                    "Next": "Shards",
                },
                "Shards": {
                    "Type": "Map",
                    "ItemsPath": "$.shards",
                    "ItemProcessor": {"StartAt": "One", "States": {"One": {"Type": "Pass", "End": True}}},
                    "ResultPath": "$.results",
                    "Next": "Ok?",
                },
                "Ok?": {
                    "Type": "Choice",
                    "Choices": [{"Variable": "$.ok", "BooleanEquals": True, "Next": "Done"}],
                    "Default": "Failed",
                },
                "Done": {"Type": "Succeed"},
                "Failed": {"Type": "Fail", "Error": "Relevo.Failed", "Cause": "a stage failed"},
            },
        }
    )
    moto_parse = AmazonStateLanguageParser._relevo_original_parse

    def described(parsed: tuple[Any, Any]) -> tuple[Any, ...]:
        program, tree = parsed
        states = {name: type(state).__name__ for name, state in program.states.states.items()}
        return type(program).__name__, program.start_at.start_at_name, states, tree.toStringTree()

    ours = described(AmazonStateLanguageParser.parse(definition))
    assert described(AmazonStateLanguageParser.parse(definition)) == ours  # from the cached tree
    assert described(moto_parse(definition)) == ours
    assert len(ours[2]) == 6  # every state, not an empty program


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


def test_a_json_path_parsed_once_finds_and_sets_what_moto_parsing_it_each_time_does() -> None:
    """parse_each_json_path_once against moto's own parse (the function it caches): the paths the
    job machine uses (fields, indexes, filters, wildcards, a result path) find and set the same
    values, twice over, and a path that does not parse is refused the same way."""
    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.utils import json_path

    from relevo_local.moto.stepfunctions import parse_each_json_path_once

    parse_each_json_path_once()
    data = {
        "job": {"id": "j1", "stages": [{"name": "build", "shards": 2}, {"name": "sign", "shards": 1}]},
        "lock": {"Attributes": {"holder": {"S": "j1"}}},
    }
    paths = ["$", "$.job.id", "$.job.stages[1].name", "$.job.stages[*].name", "$.lock.Attributes.holder.S"]

    def found(parse: Any) -> list[Any]:
        cached = json_path.parse
        json_path.parse = parse
        try:
            return [json_path.extract_json(path, copy.deepcopy(data)) for path in paths * 2]
        finally:
            json_path.parse = cached

    assert found(json_path.parse) == found(json_path.parse.__wrapped__)
    for parse in (result_path.parse, result_path.parse.__wrapped__):
        target = copy.deepcopy(data)
        parse("$.job.result").update_or_create(target, {"ok": True})
        assert target["job"]["result"] == {"ok": True}
    refusals = []
    for parse in (json_path.parse, json_path.parse.__wrapped__, json_path.parse):
        with pytest.raises(Exception) as refused:  # noqa: PT011 (the same refusal either way is the point)
            parse("$.job[")
        refusals.append((type(refused.value), str(refused.value)))
    assert refusals[0] == refusals[1] == refusals[2]


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

    from relevo_local.moto.server import serialize_attribute_values_directly

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
        stepfunction_backend = property(lambda self: Backend())  # type: ignore[assignment]  # a stand-in backend for the endpoint

    response = Endpoint.__new__(Endpoint)
    params = {"taskToken": "t-1", "error": "Relevo.Fatal.Checkout", "cause": '{"why": "no such commit"}'}
    response._get_param = params.get  # type: ignore[method-assign]  # the request parameters, given
    response.send_task_failure()
    assert told == {"token": "t-1", "error": "Relevo.Fatal.Checkout", "cause": '{"why": "no such commit"}'}


def test_a_transactions_backup_of_the_items_it_names_rolls_back_as_motos_copy_of_the_whole_table() -> None:
    """back_up_only_touched_items_in_transactions against moto's own backup (copy.deepcopy of every
    table the transaction names): on a table of many items, each transaction (one that passes,
    one a condition cancels after an earlier action wrote, one refused for naming an item twice,
    one whose update expression is refused) answers the same and leaves the same items."""
    import moto.dynamodb.models as dynamodb_models
    from moto.dynamodb.models import DynamoDBBackend

    from relevo_local.moto.dynamodb import back_up_only_touched_items_in_transactions

    back_up_only_touched_items_in_transactions()
    ours = (dynamodb_models.copy, DynamoDBBackend.transact_write_items)
    moto_own = (copy, DynamoDBBackend._relevo_original_transact_write_items)

    def put(key: str, n: str) -> dict[str, Any]:
        return {"Put": {"TableName": "t", "Item": {"pk": {"S": key}, "sk": {"S": "A"}, "n": {"N": n}}}}

    def add(key: str, condition: str | None = None) -> dict[str, Any]:
        update: dict[str, Any] = {
            "TableName": "t",
            "Key": {"pk": {"S": key}, "sk": {"S": "A"}},
            "UpdateExpression": "ADD n :one",
            "ExpressionAttributeValues": {":one": {"N": "1"}, ":big": {"N": "100"}},
        }
        if condition:
            update["ConditionExpression"] = condition
        return {"Update": update}

    transactions = [
        [
            put("new", "1"),
            add("p1"),
            {"Delete": {"TableName": "t", "Key": {"pk": {"S": "p2"}, "sk": {"S": "A"}}}},
        ],
        [put("p3", "9"), add("p4"), add("p5", "n > :big")],  # cancelled by its last condition
        [add("p6"), add("p6")],  # one item twice
        [put("p7", "7"), {"Update": {**add("p8")["Update"], "UpdateExpression": "SET pk = :one"}}],
    ]

    def run(backup: tuple[Any, Any]) -> list[Any]:
        backend = DynamoDBBackend("us-east-1", "123456789012")
        backend.create_table(
            "t",
            schema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            throughput=None,
            attr=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            global_indexes=None,
            indexes=None,
            streams=None,
            billing_mode="PAY_PER_REQUEST",
            sse_specification=None,
            tags=[],
            deletion_protection_enabled=False,
            warm_throughput=None,
        )
        for n in range(200):
            for sk in ("A", "B"):
                backend.put_item("t", {"pk": {"S": f"p{n}"}, "sk": {"S": sk}, "n": {"N": str(n)}})
        dynamodb_models.copy, DynamoDBBackend.transact_write_items = backup
        answers: list[Any] = []
        try:
            for transaction in transactions:
                try:
                    backend.transact_write_items(copy.deepcopy(transaction))
                    answers.append("passed")
                except Exception as refused:  # noqa: BLE001 (the refusal is what is compared)
                    answers.append((type(refused).__name__, str(refused)))
                answers.append(
                    sorted(
                        json.dumps(item.to_json(), sort_keys=True) for item in backend.tables["t"].all_items()
                    )
                )
        finally:
            dynamodb_models.copy, DynamoDBBackend.transact_write_items = ours
        return answers

    answered = run(ours)
    assert answered == run(moto_own)
    assert [answer for answer in answered[::2] if answer != "passed"] and answered[0] == "passed"
    assert answered[3] == answered[1] and len(answered[1]) == 400  # the cancelled one wrote nothing
