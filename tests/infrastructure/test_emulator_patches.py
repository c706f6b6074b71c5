"""Every change the local stack makes to moto is in local/emulator_patches.py or a module it
installs, each naming the moto behaviour it changes and the version checked (issue 17).

Given the local stack's modules, when their assignments are read from source, then only
emulator_patches.py and the modules it installs assign anything onto moto's modules or classes.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

LOCAL = Path(__file__).resolve().parents[2] / "local" / "relevo_local"
# The modules emulator_patches.install / install_identity / install_for_streams install.
PATCH_MODULES = {
    "emulator_patches.py", "interpreter_patches.py", "heartbeat_timeout.py", "faults.py", "emulator_iam.py",
    "dynamodb_authorization.py", "sts_sessions.py",
}


def _moto_names(tree: ast.AST) -> set[str]:
    """Names bound to something imported from moto in this module (at any depth)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("moto"):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name.startswith("moto"))
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _patches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    moto = _moto_names(tree)
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and _root(target) in moto:
                found.append(f"{path.name}:{node.lineno} assigns {ast.unparse(target)}")
    return found


def test_only_the_patch_modules_change_moto() -> None:
    elsewhere = [p for path in sorted(LOCAL.glob("*.py")) if path.name not in PATCH_MODULES for p in _patches(path)]
    assert elsewhere == [], "move these into local/emulator_patches.py:\n" + "\n".join(elsewhere)


def test_each_patch_of_emulator_patches_names_the_moto_version_checked() -> None:
    tree = ast.parse((LOCAL / "emulator_patches.py").read_text(encoding="utf-8"))
    undated = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and _patches_in(node) and "5.2.5" not in (ast.get_docstring(node) or "")
    ]
    assert undated == []


def _patches_in(function: ast.FunctionDef) -> bool:
    return any(isinstance(node, (ast.ImportFrom, ast.Import)) for node in ast.walk(function))


def test_a_json_path_is_parsed_once_and_still_finds_what_it_names() -> None:
    from moto.stepfunctions.parser.asl.utils import json_path

    from relevo_local.emulator_patches import parse_each_json_path_once

    parse_each_json_path_once()
    parse_each_json_path_once()  # idempotent: one cache, not a cache of a cache
    assert json_path.parse("$.job.stages[0]") is json_path.parse("$.job.stages[0]")
    data = {"job": {"stages": ["build", "sign"]}}
    assert json_path.extract_json("$.job.stages[1]", data) == "sign"
    assert json_path.extract_json("$.job.stages[0]", data) == "build"


def test_an_update_expression_is_parsed_once_and_a_bad_one_is_refused_each_time() -> None:
    from moto.dynamodb.exceptions import InvalidUpdateExpression
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    from relevo_local.emulator_patches import parse_each_update_expression_once

    parse_each_update_expression_once()
    parse_each_update_expression_once()  # idempotent
    text = "SET #status = :running, lease_expires_at = :lease REMOVE exit_code"
    tree = UpdateExpressionParser.make(text)
    assert UpdateExpressionParser.make(text) is tree
    assert {c.get_value_name() for c in tree.find_clauses([_attribute_value_class()])} == {":running", ":lease"}
    for _ in range(2):
        with pytest.raises(InvalidUpdateExpression):
            UpdateExpressionParser.make("SET = :nothing")


def test_an_update_expressions_form_is_checked_until_it_passes_once_and_the_item_is_still_checked_every_time() -> None:
    from moto.dynamodb.exceptions import DuplicateUpdateExpression, MockValidationException
    from moto.dynamodb.models.dynamo_type import DynamoType, Item
    from moto.dynamodb.parsing import validators
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    from relevo_local.emulator_patches import check_each_update_expressions_form_once, parse_each_update_expression_once

    parse_each_update_expression_once()
    check_each_update_expressions_form_once()
    check_each_update_expressions_form_once()  # idempotent

    class Table:
        table_key_attrs = ["pk"]
        attribute_keys = ["pk"]
        attr = []

    def validator(text: str, values: dict, names: dict | None = None) -> validators.UpdateExpressionValidator:
        item = Item(DynamoType({"S": "k"}), None, attrs={"pk": {"S": "k"}, "n": {"N": "1"}})
        return validators.UpdateExpressionValidator(UpdateExpressionParser.make(text), names or {}, values, item, Table())

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
    assert any(isinstance(p, form_checks) for p in validator(text, {":x": {"S": "1"}}, {"#a": "b"}).processors)
    # The item and the values are still checked on every use of a remembered form.
    with pytest.raises(MockValidationException):
        validator(text, {}, {"#a": "a"}).validate()  # :x not given


def _attribute_value_class() -> type:
    from moto.dynamodb.parsing.ast_nodes import ExpressionAttributeValue

    return ExpressionAttributeValue


def test_an_answer_of_plain_dicts_serializes_byte_for_byte_as_moto_would_with_each_members_keys_found_once() -> None:
    """The memo of pick_members_of_plain_answers_once against moto's own walk, on a Query answer
    holding every AttributeValue type, nested maps and lists, and a DescribeTable answer."""
    from datetime import datetime, timezone

    from moto.core import serialize
    from moto.core.utils import get_service_model

    from relevo_local.emulator_patches import pick_members_of_plain_answers_once

    pick_members_of_plain_answers_once()
    item = {
        "pk": {"S": "JOB#j1"}, "n": {"N": "12.5"}, "b": {"B": "AAEC"}, "ss": {"SS": ["a", "b"]}, "ns": {"NS": ["1", "2"]},
        "bs": {"BS": ["AAE="]}, "null": {"NULL": True}, "flag": {"BOOL": False},
        "m": {"M": {"inner": {"L": [{"S": "x"}, {"M": {"deep": {"N": "3"}}}]}, "dict_like": {"S": "key starts with dict"}}},
    }
    answers = {
        "Query": {"Items": [item, item], "Count": 2, "ScannedCount": 2, "LastEvaluatedKey": {"pk": {"S": "JOB#j1"}}},
        "DescribeTable": {"Table": {"TableName": "t", "TableStatus": "ACTIVE", "CreationDateTime": datetime(2026, 12, 3, tzinfo=timezone.utc),
                                    "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}], "ItemCount": 3}},
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


def test_a_heartbeat_before_the_tasks_wait_is_taken_as_on_aws() -> None:
    """moto 5.2.5 answered InvalidToken to a heartbeat sent after AwaitResult wrote the run token
    but before its wait began (seen in the suite under load: agent_runs failed at its first
    SendTaskHeartbeat). The token is live from the task's start on AWS."""
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackOutcomeSuccess, CallbackPoolManager

    from relevo_local.interpreter_patches import install

    install()
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
    from moto.stepfunctions.parser.asl.eval.callback.callback import CallbackOutcomeFailure, CallbackPoolManager

    from relevo_local.interpreter_patches import install

    install()
    pool = CallbackPoolManager(activity_store={})
    endpoint = pool.add("token-3")
    assert pool.notify("token-3", CallbackOutcomeFailure(callback_id="token-3", error="Relevo.Fatal.ExitCode", cause="exit 1"))
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

    from relevo_local.interpreter_patches import install

    install()
    pool = CallbackPoolManager(activity_store={})
    endpoint = pool.add("token-2")
    endpoint.wait(timeout=0.01)  # the task's wait runs out with no answer
    endpoint.interrupt_all()  # what the interpreter does when a task's wait ends, whatever ended it
    for answer in (lambda: pool.notify("token-2", CallbackOutcomeSuccess(callback_id="token-2", output="{}")),
                   lambda: pool.heartbeat("token-2")):
        with pytest.raises(CallbackNotifyConsumerError):  # the provider answers TaskTimedOut
            answer()
    # which the server can now send (unpatched: TypeError, an HTTP 500)
    from moto.stepfunctions.parser.api import TaskTimedOut

    error = TaskTimedOut()
    assert (error.error_type, error.code) == ("TaskTimedOut", 400) and "does not exist anymore" in error.message


def test_the_cause_of_a_task_failure_reaches_the_interpreter_as_on_aws() -> None:
    """moto 5.2.5's SendTaskFailure endpoint read only `error`: a callback task's catcher got an
    empty Cause, and a job's error said "no cause was reported" where the agent had said why.
    AWS passes the cause on (SendTaskFailure, Step Functions API Reference)."""
    from moto.stepfunctions.responses import StepFunctionResponse

    from relevo_local.interpreter_patches import install

    install()
    told: dict[str, object] = {}

    class Backend:
        def send_task_failure(self, task_token: str, error: str | None = None, cause: str | None = None) -> None:
            told.update(token=task_token, error=error, cause=cause)

    class Endpoint(StepFunctionResponse):
        stepfunction_backend = property(lambda self: Backend())  # type: ignore[assignment]

    response = Endpoint.__new__(Endpoint)
    params = {"taskToken": "t-1", "error": "Relevo.Fatal.Checkout", "cause": '{"why": "no such commit"}'}
    response._get_param = params.get  # type: ignore[method-assign]
    response.send_task_failure()
    assert told == {"token": "t-1", "error": "Relevo.Fatal.Checkout", "cause": '{"why": "no such commit"}'}


def test_moto_lists_its_modules_once_and_still_finds_a_service_by_its_name() -> None:
    from moto import backends
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    from relevo_local.emulator_patches import list_moto_modules_once

    list_moto_modules_once()
    list_moto_modules_once()  # idempotent
    assert backends.list_of_moto_modules() is backends.list_of_moto_modules()
    assert {"dynamodb", "stepfunctions", "sqs"} <= set(backends.list_of_moto_modules())
    dispatcher = DomainDispatcherApplication(create_app=lambda service: None)
    assert dispatcher.get_backend_for_host("dynamodb") == "dynamodb"
