"""Patches over moto's DynamoDB: one action at a time, transactions that back up only what they
touch and roll back the stream as DynamoDB does, and the stream left to the local poller. Each docstring names
the moto 5.2.5 behaviour it changes;
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


def query_a_tables_partition_only() -> None:
    """moto 5.2.5 answers a Query of a table (no index) by listing every item of the table, sorting
    them all by key (Table.all_items, comparing DynamoType values through Decimal and the like),
    and keeping those of the queried partition: each Query costs as much as the table holds, so
    the stack slowed as it lived (a third of a claim's reads of its job in bench/agent.py, more
    as jobs accumulate). The items of a partition are the ones its hash key finds in the table's
    items (moto's own GetItem looks them up so, and DynamoType hashes as it compares), so while
    a table's Query runs, the listing it asks for is that partition's, in the same key order;
    an index's Query and everything else still list the whole table.

    Measured gain (tests/helpers/emulator_patches.py, switched off and on between interleaved four-stage
    jobs on the shared 2-core machine, medians): wall time, since the listing holds the one lock
    of DynamoDB actions (apply_dynamodb_actions_one_at_a_time) while other calls wait: 0.71 s of a
    job's 2.6 s with 2,000 other items in the table, 0.84 s of 3.0 s with 4,000 (the emulator's
    CPU: 0.05 s and 0.21 s per job)."""
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
    restores every item it touched. Installed once, for the emulator running in this process.

    The backup is for speed, and what it costs grows as the stack lives (moto copies the whole
    table once per action of each transaction). Measured gain (tests/helpers/emulator_patches.py, switched
    off and on between interleaved four-stage jobs on the shared 2-core machine, medians): 0.75 s
    of the emulator's CPU per job on a fresh table, rising with every job (1.5 s, the median of
    the first three rounds); 3.0 s per job (4.0 s off, 1.0 s on) with 4,000 other items in the
    table, and 6.3 s of a job's wall time. The roll-back of the stream is DynamoDB's behaviour
    (TransactWriteItems,
    DynamoDB API Reference: a cancelled transaction writes nothing)."""
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
    dynamodb_models.DynamoDBBackend._relevo_original_transact_write_items = original
    dynamodb_models.DynamoDBBackend.transact_write_items = transact_write_items
    dynamodb_models._relevo_cheap_backups = True


def detach_emulator_stream_invoker(table_name: str, account_id: str, region: str) -> None:
    """moto 5.2.5 links a table to the Lambda event source mappings created for its stream and, on
    every write, invokes the function through Docker (absent here): each write then waits for
    that attempt, and the failed attempt's error text also empties the stream's records. The
    local poller delivers the stream instead, so the link is cut in the emulator's backend (it
    runs in this process); the mapping itself stays listed as deployed."""
    from moto.dynamodb.models import dynamodb_backends

    dynamodb_backends[account_id][region].get_table(table_name).lambda_event_source_mappings.clear()
