"""Every change the local stack makes to moto, and the one place that says which are installed.

moto 5.2.5 (checked with aws-sam-translator 1.115 and Python 3.11) is the embedded AWS; where it
reads a template, a state machine or a request differently from AWS, or too slowly to test with,
the local stack patches it, and only here or in the modules `install` names below. Each patch
names the moto behaviour it changes and the version it was checked against; re-check them all
when moto changes.

Installed by `install()`, before the emulator starts:
- parse_each_state_machine_definition_once: moto re-parses the ASL on every StartExecution;
- parse_each_json_path_once: moto builds a JSONPath parser for every path it evaluates;
- parse_each_update_expression_once: moto parses an UpdateExpression twice per UpdateItem;
- check_each_update_expressions_form_once: moto checks an expression's clauses and paths on every
  UpdateItem, once per node of its tree;
- pick_members_of_plain_answers_once: moto's serializer asks six alias providers per member of
  every structure of an answer (each attribute value of each item);
- list_moto_modules_once: moto's server lists its own package directory on every request;
- heartbeat_timeout.name_heartbeat_timeouts: moto names a heartbeat lapse States.Timeout, AWS
  States.HeartbeatTimeout;
- store_key_policies_as_json: moto's CloudFormation stores a KMS KeyPolicy as a parsed object;
- answer_managed_policy_attributes: moto's ManagedPolicy answers no Fn::GetAtt / Ref;
- drop_no_value_from_lists: moto keeps AWS::NoValue inside lists;
- attach_managed_policies_of_stack_roles: moto's CloudFormation ignores a role's ManagedPolicyArns;
- interpreter_patches.install: the Step Functions interpreter's aws-sdk parameters and stops;
- faults.install: transaction conflicts a test can inject (inert until armed);
- emulator_server: each DynamoDB action applied one at a time (moto's backend has no lock),
  its request's parsing, authorization and answer outside the lock.
Installed by `install_identity(sessions)`, once the stack's IAM user exists: emulator_iam.install
(the interpreter runs as the execution role, IAM checks moto skips, DynamoDB authorization as AWS
does it in dynamodb_authorization.py).
Installed by `install_for_streams()`, before the stream pollers start: transaction backups that
copy only the touched items and share stream records.
Applied to the running emulator's state: point_api_url_output_at_the_adapter,
detach_emulator_stream_invoker.
"""

from __future__ import annotations

import copy
import json
import threading
from types import SimpleNamespace
from typing import Any

from relevo_local import emulator_iam, faults, heartbeat_timeout, interpreter_patches

ACCOUNT_ID = emulator_iam.ACCOUNT_ID


def install() -> None:
    """The patches the emulator needs before it starts (idempotent: each one installs once)."""
    parse_each_state_machine_definition_once()
    parse_each_json_path_once()
    parse_each_update_expression_once()
    check_each_update_expressions_form_once()
    pick_members_of_plain_answers_once()
    list_moto_modules_once()
    heartbeat_timeout.name_heartbeat_timeouts()
    store_key_policies_as_json()
    answer_managed_policy_attributes()
    drop_no_value_from_lists()
    attach_managed_policies_of_stack_roles()
    interpreter_patches.install()
    faults.install()  # inert until a test arms a fault (local/faults.py)


def install_identity(sessions: emulator_iam.RoleSessions) -> None:
    """IAM as AWS enforces it, once the stack's own IAM user exists (local/emulator_iam.py)."""
    emulator_iam.install(sessions)


def install_for_streams() -> None:
    """Before DynamoDB stream pollers start: transactions back up only what they touch, and the
    stream records those backups hold are shared, not copied."""
    share_stream_records_in_transaction_backups()
    back_up_only_touched_items_in_transactions()


_TRANSACTION_KEYS = threading.local()


def parse_each_state_machine_definition_once() -> None:
    """moto 5.2.5 parses a state machine's ASL with its ANTLR grammar on every StartExecution, before
    the execution's first event: about 1 s for job.asl.json on this class of machine, which
    every job's handoff paid. The syntax tree depends on the definition text only, so it is
    parsed once per definition; the evaluation program is still built fresh from it for each
    execution (those components are per execution, the tree is only read). A definition with
    syntax errors is not cached and fails as before. Installed once, for the emulator running
    in this process."""
    from functools import lru_cache

    from antlr4 import CommonTokenStream, InputStream
    from moto.stepfunctions.parser.asl.antlr.runtime.ASLLexer import ASLLexer
    from moto.stepfunctions.parser.asl.antlr.runtime.ASLParser import ASLParser
    from moto.stepfunctions.parser.asl.parse import asl_parser
    from moto.stepfunctions.parser.asl.parse.preprocessor import Preprocessor

    parser_class = asl_parser.AmazonStateLanguageParser
    if getattr(parser_class, "_relevo_tree_cache", False):
        return

    @lru_cache(maxsize=32)
    def syntax_tree(definition: str) -> Any:
        errors = asl_parser.SyntaxErrorListener()
        parser = ASLParser(CommonTokenStream(ASLLexer(InputStream(definition))))
        parser.removeErrorListeners()
        parser.addErrorListener(errors)
        tree = parser.state_machine()
        if errors.errors:
            raise asl_parser.ASLParserException(errors=errors.errors)
        return tree

    def parse(definition: str) -> tuple[Any, Any]:
        tree = syntax_tree(definition)
        return Preprocessor().visit(tree), tree

    parser_class.parse = staticmethod(parse)
    parser_class._relevo_tree_cache = True


def parse_each_json_path_once() -> None:
    """moto 5.2.5's interpreter parses a JSONPath with jsonpath_ng on every evaluation
    (utils/json_path.extract_json for paths and intrinsic arguments, ResultPath for results), and
    jsonpath_ng builds a new ply lexer and parser for each: about a sixth of a busy test worker's
    CPU went there. A parsed path is an immutable expression tree that `find` and `update` only
    read, so each path text is parsed once. Installed once, for the emulator in this process."""
    from functools import lru_cache

    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.utils import json_path

    for module in (json_path, result_path):
        if not getattr(module.parse, "_relevo_cached", False):
            cached = lru_cache(maxsize=4096)(module.parse)
            cached._relevo_cached = True  # type: ignore[attr-defined]
            module.parse = cached


def parse_each_update_expression_once() -> None:
    """moto 5.2.5 parses an UpdateExpression twice per UpdateItem (DynamoHandler.update_item checks
    its placeholders, DynamoDBBackend.update_item applies it), with a tokenizer and recursive
    parser written in Python: a fifth of the emulator's CPU for a stage claim. The parsed tree is
    only read: UpdateExpressionValidator deep-copies it before its processors rewrite nodes, and
    normalize() runs on that copy. So each expression text is parsed once; one that does not
    parse raises each time, as before (lru_cache keeps no exception)."""
    from functools import lru_cache

    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    if getattr(UpdateExpressionParser, "_relevo_parsed_once", False):
        return
    make = UpdateExpressionParser.make.__func__

    @lru_cache(maxsize=1024)
    def parsed(expression: str) -> Any:
        return make(UpdateExpressionParser, expression)

    UpdateExpressionParser.make = classmethod(lambda cls, expression_str: parsed(expression_str) if cls is UpdateExpressionParser else make(cls, expression_str))
    UpdateExpressionParser._relevo_parsed_once = True  # type: ignore[attr-defined]


def check_each_update_expressions_form_once() -> None:
    """moto 5.2.5 validates an UpdateExpression with ten passes over its tree on every UpdateItem;
    two of them, ActionCountValidator (one SET, ADD, REMOVE clause each) and
    OverlappingPathsValidator (no path set twice), look at the expression and its attribute names
    alone, and do it for each of the tree's UpdateExpression nodes: a third of a stage claim's
    CPU in the emulator. Their verdict on the same parsed expression (parse_each_update_expression_once
    hands out one tree per text) with the same names is the same, so once an expression passed
    them they are left out of its later validations; the passes that read the item and the
    values all still run, and an expression that failed them is checked again each time."""
    from moto.dynamodb.parsing import validators

    validator = validators.UpdateExpressionValidator
    if getattr(validator, "_relevo_form_once", False):
        return
    form_checks = (validators.ActionCountValidator, validators.OverlappingPathsValidator)
    initialize, processors_of, validate = validator.__init__, validator.get_ast_processors, validator.validate
    # (id of the parsed tree, its attribute names) -> the tree, kept so that its id is not reused.
    passed: dict[tuple[int, tuple[tuple[str, str], ...]], Any] = {}

    def __init__(self: Any, expression: Any, expression_attribute_names: Any, *args: Any, **kwargs: Any) -> None:
        self._relevo_form = (id(expression), tuple(sorted((expression_attribute_names or {}).items())))
        self._relevo_tree = expression
        initialize(self, expression, expression_attribute_names, *args, **kwargs)

    def get_ast_processors(self: Any) -> Any:
        processors = processors_of(self)
        if self._relevo_form in passed:
            processors = [p for p in processors if not isinstance(p, form_checks)]
        return processors

    def validate_and_remember(self: Any) -> Any:
        validated = validate(self)
        if len(passed) > 4096:
            passed.clear()
        passed[self._relevo_form] = self._relevo_tree
        return validated

    validator.__init__ = __init__
    validator.get_ast_processors = get_ast_processors
    validator.validate = validate_and_remember
    validator._relevo_form_once = True  # type: ignore[attr-defined]


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


def store_key_policies_as_json() -> None:
    """moto 5.2.5's CloudFormation creates an AWS::KMS::Key with its KeyPolicy as a parsed
    document; its KMS API then fails (500) on every call that reads the policy (DescribeKey,
    GetKeyPolicy), which expect the JSON text KMS keeps. Give it the text. Installed once."""
    import moto.kms.models as kms_models

    if getattr(kms_models, "_relevo_key_policy_text", False):
        return
    original = kms_models.Key.create_from_cloudformation_json.__func__

    def create_from_cloudformation_json(cls: Any, resource_name: str, cloudformation_json: Any, *args: Any, **kwargs: Any) -> Any:
        properties = cloudformation_json.get("Properties", {})
        if isinstance(properties.get("KeyPolicy"), dict):
            cloudformation_json = {**cloudformation_json, "Properties": {**properties, "KeyPolicy": json.dumps(properties["KeyPolicy"])}}
        return original(cls, resource_name, cloudformation_json, *args, **kwargs)

    kms_models.Key.create_from_cloudformation_json = classmethod(create_from_cloudformation_json)
    kms_models._relevo_key_policy_text = True


def attach_managed_policies_of_stack_roles() -> None:
    """An AWS::IAM::Role's ManagedPolicyArns are attached to it (CloudFormation, AWS::IAM::Role);
    moto 5.2.5's CloudFormation ignores the property, so a role whose powers come from a managed
    policy (each region's agent role) could do nothing. Attach the ones the emulator has: the
    stack's own; AWS managed policies (SAM's AWSLambdaBasicExecutionRole, AWSXrayWriteOnlyAccess)
    are not loaded by moto and grant only CloudWatch Logs and X-Ray, which no function calls
    through the API locally. Installed once."""
    from moto.iam.models import Role, iam_backends

    if getattr(Role, "_relevo_managed_policy_arns", False):
        return
    original = Role.create_from_cloudformation_json.__func__

    def create_from_cloudformation_json(cls: Any, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str, **kwargs: Any) -> Any:
        role = original(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
        backend = iam_backends[account_id]["aws"]
        known = {policy.arn for policy in backend.managed_policies.values()}
        for arn in cloudformation_json.get("Properties", {}).get("ManagedPolicyArns", []):
            if arn in known:
                backend.attach_role_policy(arn, role.name)
        return role

    Role.create_from_cloudformation_json = classmethod(create_from_cloudformation_json)
    Role._relevo_managed_policy_arns = True


def drop_no_value_from_lists() -> None:
    """`AWS::NoValue` removes what it stands for, a list element included (CloudFormation,
    pseudo parameters: AWS::NoValue), e.g. a trust policy statement behind `Fn::If`. moto 5.2.5
    drops it from maps but leaves None in a list, and its IAM then fails (500) on the trust
    policy's None statement. Drop it from lists too. Installed once."""
    import moto.cloudformation.parsing as parsing

    if getattr(parsing, "_relevo_no_value_in_lists", False):
        return
    original = parsing.clean_json

    def clean_json(resource_json: Any, resources_map: Any) -> Any:
        if isinstance(resource_json, list):
            cleaned = (original(value, resources_map) for value in resource_json)
            return [value for value in cleaned if value is not None]
        return original(resource_json, resources_map)

    parsing.clean_json = clean_json
    parsing._relevo_no_value_in_lists = True


def answer_managed_policy_attributes() -> None:
    """`Fn::GetAtt [Policy, PolicyArn]` of an AWS::IAM::ManagedPolicy is its ARN (CloudFormation
    resource reference, return values); moto 5.2.5's ManagedPolicy has no attributes at all and
    fails the stack with an AttributeError. Installed once."""
    from moto.iam.models import ManagedPolicy

    if getattr(ManagedPolicy, "_relevo_cfn_attributes", False):
        return

    def get_cfn_attribute(self: Any, attribute_name: str) -> str:
        from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

        if attribute_name == "PolicyArn":
            return str(self.arn)
        if attribute_name == "PolicyId":
            return str(self.id)
        raise UnformattedGetAttTemplateException()

    ManagedPolicy.has_cfn_attr = classmethod(lambda cls, attr: attr in ("PolicyArn", "PolicyId"))
    ManagedPolicy.get_cfn_attribute = get_cfn_attribute
    ManagedPolicy._relevo_cfn_attributes = True


def back_up_only_touched_items_in_transactions() -> None:
    """moto 5.2.5 backs up each table a TransactWriteItems call names with copy.deepcopy of the whole
    table (items, and the stream's history), so every transaction costs as much as the table
    holds and the stack slows as it lives. A transaction can only change the items it names, so
    the backup here deep-copies exactly those and shares the rest; a failed transaction still
    restores every item it touched. Installed once, for the emulator running in this process."""
    from collections import defaultdict

    import moto.dynamodb.models as dynamodb_models
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    if getattr(dynamodb_models, "_relevo_cheap_backups", False):
        return
    real_copy = copy

    def backup(table: Table, keys: set[tuple[Any, Any]]) -> Table:
        clone = real_copy.copy(table)
        if table.has_range_key:
            clone.items = defaultdict(dict, {h: dict(part) for h, part in table.items.items()})
            for h, r in keys:
                if r in table.items.get(h, {}):
                    clone.items[h][r] = real_copy.deepcopy(table.items[h][r])
        else:
            clone.items = defaultdict(dict, table.items)
            for h, _ in keys:
                if h in table.items:
                    clone.items[h] = real_copy.deepcopy(table.items[h])
        if getattr(table, "stream_shard", None) is not None:
            shard = real_copy.copy(table.stream_shard)
            shard.items, shard.table = list(table.stream_shard.items), clone
            clone.stream_shard = shard
        return clone

    def deepcopy(obj: Any, memo: Any = None) -> Any:
        keys = getattr(_TRANSACTION_KEYS, "by_table", None)
        if isinstance(obj, Table) and keys is not None and keys.get(obj.name) is not None:
            return backup(obj, keys[obj.name])
        return real_copy.deepcopy(obj, memo)

    original = dynamodb_models.DynamoDBBackend.transact_write_items

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        by_table: dict[str, set[tuple[Any, Any]] | None] = {}
        for entry in transact_items:
            _, op = next(iter(entry.items()))
            table = self.tables.get(op.get("TableName"))
            if table is None:
                continue
            attributes = op.get("Key") or op.get("Item") or {}
            hash_value = attributes.get(table.hash_key_attr)
            range_value = attributes.get(table.range_key_attr) if table.has_range_key else None
            if hash_value is None or (table.has_range_key and range_value is None):
                by_table[table.name] = None  # key not readable here: back up the whole table
                continue
            if table.name in by_table and by_table[table.name] is None:
                continue
            by_table.setdefault(table.name, set()).add(
                (DynamoType(hash_value), DynamoType(range_value) if range_value is not None else None)
            )
        _TRANSACTION_KEYS.by_table = by_table
        # moto 5.2.5 rolls a cancelled transaction back by putting the backup Table in place, its
        # stream shard a new object: readers holding an iterator of the live shard (the stack's
        # stream pollers) then read a shard nothing writes to any more, and the records the
        # failed transaction appended stay in it. DynamoDB writes nothing for a cancelled
        # transaction, to the table or its stream; so the live shard is kept, cut back to its
        # length before the transaction.
        shards = {
            name: (table.stream_shard, len(table.stream_shard.items))
            for name in by_table
            if (table := self.tables.get(name)) is not None and getattr(table, "stream_shard", None) is not None
        }
        try:
            return original(self, transact_items)
        finally:
            _TRANSACTION_KEYS.by_table = None
            for name, (shard, length) in shards.items():
                restored = self.tables.get(name)
                if restored is not None and restored.stream_shard is not shard:
                    del shard.items[length:]
                    shard.table, restored.stream_shard = restored, shard

    dynamodb_models.copy = SimpleNamespace(deepcopy=deepcopy, copy=real_copy.copy)
    dynamodb_models.DynamoDBBackend.transact_write_items = transact_write_items
    dynamodb_models._relevo_cheap_backups = True


def share_stream_records_in_transaction_backups() -> None:
    """moto 5.2.5 backs up a whole table with copy.deepcopy before each TransactWriteItems item, and a
    table with a stream carries every stream record ever written: each intake transaction would
    then deep-copy the stream's whole history, so transactions slow down as the stack lives.
    Stream records are never changed after they are appended, so the backup copies the list of
    them (a rolled-back transaction still drops the records it appended) and shares the records."""
    from moto.dynamodb.models.table import StreamShard

    if getattr(StreamShard, "_relevo_shallow_records", False):
        return

    def __deepcopy__(self: StreamShard, memo: dict[int, Any]) -> StreamShard:
        clone = copy.copy(self)
        memo[id(self)] = clone
        clone.table = copy.deepcopy(self.table, memo)
        clone.items = list(self.items)
        return clone

    StreamShard.__deepcopy__ = __deepcopy__  # type: ignore[attr-defined]
    StreamShard._relevo_shallow_records = True  # type: ignore[attr-defined]


def point_api_url_output_at_the_adapter(stack_name: str, region: str, url: str) -> None:
    """On AWS the stack's ApiUrl output is the API's invoke URL. Locally the API is served by the
    adapter (moto 5.2.5 cannot create SAM's RestApi), so the output names the adapter's URL: a
    tool that finds the stack through CloudFormation (`relevo stack use`) reaches its API."""
    from moto.cloudformation.models import cloudformation_backends

    for stack in cloudformation_backends[ACCOUNT_ID][region].stacks.values():
        if stack.name == stack_name and "ApiUrl" in stack.output_map.outputs:
            stack.output_map["ApiUrl"].value = url


def detach_emulator_stream_invoker(table_name: str, account_id: str, region: str) -> None:
    """moto 5.2.5 links a table to the Lambda event source mappings created for its stream and, on
    every write, invokes the function through Docker (absent here): each write then waits for
    that attempt, and the failed attempt's error text also empties the stream's records. The
    local poller delivers the stream instead, so the link is cut in the emulator's backend (it
    runs in this process); the mapping itself stays listed as deployed."""
    from moto.dynamodb.models import dynamodb_backends

    dynamodb_backends[account_id][region].get_table(table_name).lambda_event_source_mappings.clear()


def emulator_server(host: str, port: int) -> Any:
    """moto's ThreadedMotoServer (5.2.5), with each DynamoDB action applied one at a time
    (apply_dynamodb_actions_one_at_a_time)."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    apply_dynamodb_actions_one_at_a_time()

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    return Server(ip_address=host, port=port, verbose=False)


# The one lock every DynamoDB action of the emulator takes (apply_dynamodb_actions_one_at_a_time).
DYNAMODB_ACTIONS = threading.Lock()


def apply_dynamodb_actions_one_at_a_time() -> None:
    """moto's server handles requests on concurrent threads, and its DynamoDB backend has no lock:
    two conditional writes (or transactions) on one item can both pass their condition, or fail
    with a 500. DynamoDB itself applies conditional writes atomically and transactions
    serializably, so the emulator applies one DynamoDB action at a time (checked with moto 5.2.5).

    The lock holds the action alone (moto's each operation's method of DynamoHandler, which
    reads or writes the backend and builds its answer from copies of the items, Item.to_json);
    parsing the request, IAM's authorization and serializing the answer (moto's shape-walking
    serializer: most of a large Query's time) run outside it, side by side, as they do on AWS. A
    lock around the whole request made two reads issued together wait for each other."""
    from botocore import xform_name
    from moto.dynamodb.responses import DynamoHandler

    if getattr(DynamoHandler, "_relevo_one_at_a_time", False):
        return
    from moto.core.utils import get_service_model

    for operation in get_service_model("dynamodb").operation_names:
        name = xform_name(operation)
        action = DynamoHandler.__dict__.get(name)
        if action is None:
            continue  # an operation moto does not implement: answered without the backend

        def locked(self: Any, _action: Any = action) -> Any:
            with DYNAMODB_ACTIONS:
                return _action(self)

        locked.__name__ = locked.__qualname__ = name
        setattr(DynamoHandler, name, locked)
    DynamoHandler._relevo_one_at_a_time = True  # type: ignore[attr-defined]
