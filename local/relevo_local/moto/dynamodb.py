"""Patches over moto's DynamoDB: expressions parsed and checked once, one action at a time,
transactions that back up only what they touch and roll back the stream as DynamoDB does, and the
stream left to the local poller. Each docstring names the moto 5.2.5 behaviour it changes;
docs/emulator.md lists them with the test that pins each."""

from __future__ import annotations

import copy
import inspect
import threading
from types import SimpleNamespace
from typing import Any

# The keys each table's items a transaction names, while moto backs the tables up (this thread's).
_TRANSACTION_KEYS = threading.local()
# The one lock every DynamoDB action of the emulator takes (apply_dynamodb_actions_one_at_a_time).
DYNAMODB_ACTIONS = threading.Lock()


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

    UpdateExpressionParser.make = classmethod(
        lambda cls, expression_str: parsed(expression_str)
        if cls is UpdateExpressionParser
        else make(cls, expression_str)
    )
    UpdateExpressionParser._relevo_parsed_once = True


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

    def __init__(
        self: Any, expression: Any, expression_attribute_names: Any, *args: Any, **kwargs: Any
    ) -> None:
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
    validator._relevo_form_once = True


def traverse_expression_trees_by_node_type() -> None:
    """moto 5.2.5 validates an UpdateExpression with up to ten depth-first passes over its tree
    (DepthFirstTraverser), and at every node of every pass builds the pass's processing map anew
    and asks isinstance() of its node classes, which are abc.ABCMeta classes (their check goes
    through Python): two fifths of the emulator's time in a stage claim's UpdateItem. Which node
    classes a pass processes is fixed by its class (each _processing_map is a literal of the
    pass's class), so whether a pass processes a node is worked out once per pass class and node
    class; the walk itself is moto's: children first, left to right, each child's hook before it,
    a processed node put in its parent's place."""
    from moto.dynamodb.parsing import ast_nodes

    traverser = ast_nodes.DepthFirstTraverser
    if getattr(traverser, "_relevo_by_node_type", False):
        return
    node_class = ast_nodes.Node
    # (pass class, node class) -> whether the pass processes nodes of that class; node class -> is a Node.
    processes: dict[tuple[type, type], bool] = {}
    is_node: dict[type, bool] = {}

    def traverse_node_recursively(self: Any, node: Any, child_id: int = -1) -> Any:
        kind = type(node)
        node_like = is_node.get(kind)
        if node_like is None:
            node_like = is_node[kind] = issubclass(kind, node_class)
        if not node_like:
            return node
        parent = node.parent
        if node.children is not None:
            for index, child in enumerate(node.children):
                self.pre_processing_of_child(node, index)
                self.traverse_node_recursively(child, index)
        key = (type(self), kind)
        processed = processes.get(key)
        if processed is None:
            processed = processes[key] = issubclass(kind, tuple(self._processing_map()))
        if processed:
            node = self.process(node)
            node.parent = parent
            if parent:
                parent.children[child_id] = node
        return node

    traverser.traverse_node_recursively = traverse_node_recursively
    traverser._relevo_by_node_type = True


def copy_expression_trees_node_by_node() -> None:
    """moto 5.2.5 deep-copies an UpdateExpression's parsed tree on every UpdateItem before its
    validation passes rewrite it (Validator.__init__), with copy.deepcopy: reduce protocol and
    memo for each of some 850 objects, a fifth of a stage claim's UpdateItem. A tree node is a
    plain object (no __deepcopy__, __getstate__, __setstate__ or __slots__ on any class of
    moto.dynamodb.parsing), so the validators' deepcopy copies nodes, their lists and dicts
    itself, attribute by attribute, with the same memo (a node seen twice, such as a parent, is
    copied once); anything else (a DynamoType, which has its own __deepcopy__) goes to
    copy.deepcopy with that memo."""
    from moto.dynamodb.parsing import ast_nodes, validators

    if getattr(validators, "_relevo_node_by_node", False):
        return
    node_class = ast_nodes.Node
    atoms = (str, int, float, bool, type(None))

    def copied(value: Any, memo: dict[int, Any]) -> Any:
        kind = type(value)
        if kind in atoms:
            return value
        known = memo.get(id(value))
        if known is not None:
            return known
        if kind is list:
            new_list: list[Any] = []
            memo[id(value)] = new_list
            new_list.extend(copied(element, memo) for element in value)
            return new_list
        if kind is dict:
            new_dict: dict[Any, Any] = {}
            memo[id(value)] = new_dict
            for key, element in value.items():
                new_dict[copied(key, memo)] = copied(element, memo)
            return new_dict
        if issubclass(kind, node_class):
            node = kind.__new__(kind)  # type: ignore[call-overload]  # a node class's bare instance
            memo[id(value)] = node
            node.__dict__.update({name: copied(element, memo) for name, element in value.__dict__.items()})
            return node
        return copy.deepcopy(value, memo)

    def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
        # copy.deepcopy keeps what it copied alive in the memo under the memo's own id; so does this.
        memo = {} if memo is None else memo
        kept = memo.setdefault(id(memo), [])
        kept.append(value)
        return copied(value, memo)

    validators.deepcopy = deepcopy
    validators._relevo_node_by_node = True


def query_a_tables_partition_only() -> None:
    """moto 5.2.5 answers a Query of a table (no index) by listing every item of the table, sorting
    them all by key (Table.all_items, comparing DynamoType values through Decimal and the like),
    and keeping those of the queried partition: each Query costs as much as the table holds, so
    the stack slowed as it lived (a third of a claim's reads of its job in bench/agent.py, more
    as jobs accumulate). The items of a partition are the ones its hash key finds in the table's
    items (moto's own GetItem looks them up so, and DynamoType hashes as it compares), so while
    a table's Query runs, the listing it asks for is that partition's, in the same key order;
    an index's Query and everything else still list the whole table."""
    from moto.dynamodb.models.table import Table

    if getattr(Table, "_relevo_partition_only", False):
        return
    list_all, query = Table.all_items, Table.query
    querying = threading.local()

    def all_items(self: Any) -> Any:
        partition = getattr(querying, "partition", None)
        if partition is None or partition[0] is not self:
            return list_all(self)
        found = self.items.get(partition[1])
        if found is None:
            return []
        if not isinstance(found, dict):  # a table without a range key: the item itself
            return [found]
        return sorted(
            found.values(),
            key=lambda item: (item.hash_key, item.range_key) if item.range_key else item.hash_key,
        )

    signature = inspect.signature(query)

    def table_query(self: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        # DynamoDBBackend.query passes the index name by position.
        if (
            hash_key is None
            or signature.bind(self, hash_key, *args, **kwargs).arguments.get("index_name") is not None
        ):
            return query(self, hash_key, *args, **kwargs)
        querying.partition = (self, hash_key)
        try:
            return query(self, hash_key, *args, **kwargs)
        finally:
            querying.partition = None

    Table.all_items = all_items
    Table.query = table_query
    Table._relevo_original_all_items = list_all
    Table._relevo_partition_only = True


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
    DynamoHandler._relevo_one_at_a_time = True


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
        stream_shard = getattr(table, "stream_shard", None)
        if stream_shard is not None:
            shard = real_copy.copy(stream_shard)
            shard.items, shard.table = list(stream_shard.items), clone
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
            by_table.setdefault(table.name, set()).add(  # type: ignore[union-attr]  # None was skipped above
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
            if (table := self.tables.get(name)) is not None
            and getattr(table, "stream_shard", None) is not None
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

    StreamShard.__deepcopy__ = __deepcopy__
    StreamShard._relevo_shallow_records = True


def detach_emulator_stream_invoker(table_name: str, account_id: str, region: str) -> None:
    """moto 5.2.5 links a table to the Lambda event source mappings created for its stream and, on
    every write, invokes the function through Docker (absent here): each write then waits for
    that attempt, and the failed attempt's error text also empties the stream's records. The
    local poller delivers the stream instead, so the link is cut in the emulator's backend (it
    runs in this process); the mapping itself stays listed as deployed."""
    from moto.dynamodb.models import dynamodb_backends

    dynamodb_backends[account_id][region].get_table(table_name).lambda_event_source_mappings.clear()
