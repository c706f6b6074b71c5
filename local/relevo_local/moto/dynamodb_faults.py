"""Faults AWS produces that the local stack would never produce by itself, switched on by tests.

The local stack applies DynamoDB actions one at a time (dynamodb.apply_dynamodb_actions_one_at_a_time), so two
transactions never overlap and DynamoDB's optimistic concurrency never cancels one. On AWS a
`TransactWriteItems` that overlaps another transaction or write on one of its items is cancelled
with `TransactionCanceledException`, the item's cancellation reason being `TransactionConflict`
(DynamoDB API Reference, TransactWriteItems, Errors; Developer Guide, "Transaction conflict
handling in DynamoDB"). It never fails with `TransactionConflictException`: that is the error
of a single-item write that meets an ongoing transaction.

`transaction_conflicts` makes the next N matching `TransactWriteItems` calls fail that way. It
acts inside moto's DynamoDB backend (moto 5.2.5: `DynamoDBBackend.transact_write_items`, in
this process, like the other patches of relevo_local.moto) and raises moto's own
`TransactionCanceledException` before anything is written, so the error goes through moto's
real response path (HTTP 400, `CancellationReasons`, the message listing the reasons) and
through the Step Functions interpreter's real error mapping (`DynamoDb.TransactionCanceledException`,
the message as the Cause).

`write_conflicts` makes the next N `UpdateItem` calls on items of a key prefix fail the way a
single-item write that meets an ongoing transaction on its item fails:
`TransactionConflictException` ("Operation was rejected because there is an ongoing transaction
for the item"), `DynamoDB.TransactionConflictException` in the state machine. A release of a
project lock meets the transactions waiters park with on that lock this way.

A transaction matches by the partition-key prefixes of its items, in order: ("JOB#", "COUNTER#") is
MarkStarted's transaction; `operations` tells apart two transactions on the same items
(("ConditionCheck", "Update") is WaitForProject's park, ("Update", "Update") AcquireAsQueueHead). The Step
Functions interpreter's calls are not told apart by caller:
its credentials are an emulator detail (moto 5.2.5 signs them with a fixed key) that the local
stack may change, while the items a transaction names identify the state exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

CONFLICT_CODE = "TransactionConflict"
# DynamoDB's message for this reason (CancellationReason.Message).
CONFLICT_MESSAGE = "Transaction is ongoing for the item"


def operations(transact_items: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """Each item's operation: Put, Update, Delete or ConditionCheck."""
    return tuple(next(iter(entry)) for entry in transact_items)


def key_prefixes(transact_items: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The partition keys of a transaction's items, each up to and including its first '#'."""
    prefixes = []
    for entry in transact_items:
        _, op = next(iter(entry.items()))
        attributes = op.get("Key") or op.get("Item") or {}
        pk = next(iter((attributes.get("pk") or {"S": ""}).values()))
        prefixes.append(str(pk).split("#", 1)[0] + "#" if "#" in str(pk) else str(pk))
    return tuple(prefixes)


@dataclass
class ConflictInjection:
    """An armed switch: `remaining` calls still to fail; `failed` the prefixes of those it failed."""

    prefixes: tuple[str, ...]
    remaining: int
    conflict_on: int = 0
    operations: tuple[str, ...] | None = None
    failed: list[tuple[str, ...]] = field(default_factory=list)

    def matches(self, transact_items: Sequence[dict[str, Any]]) -> bool:
        return (
            self.remaining > 0
            and key_prefixes(transact_items) == self.prefixes
            and (self.operations is None or operations(transact_items) == self.operations)
        )


@dataclass
class WriteConflictInjection:
    """An armed switch for single-item writes: `remaining` UpdateItem calls on items whose
    partition key starts with `prefix` still to fail; `failed` their partition keys."""

    prefix: str
    remaining: int
    failed: list[str] = field(default_factory=list)


_lock = threading.Lock()
_armed: list[ConflictInjection] = []
_armed_writes: list[WriteConflictInjection] = []


@contextmanager
def transaction_conflicts(
    count: int, prefixes: Sequence[str], conflict_on: int = 0, operations: Sequence[str] | None = None
) -> Iterator[ConflictInjection]:
    """Within the block, the next `count` TransactWriteItems calls whose items' partition keys
    start with `prefixes` (in order), and whose items are these `operations` when given, are
    cancelled: item `conflict_on` with reason TransactionConflict and the others with None, as
    DynamoDB reports them."""
    raise_armed_conflicts()
    injection = ConflictInjection(
        tuple(prefixes), count, conflict_on, tuple(operations) if operations else None
    )
    with _lock:
        _armed.append(injection)
    try:
        yield injection
    finally:
        with _lock:
            _armed.remove(injection)


@contextmanager
def write_conflicts(count: int, prefix: str) -> Iterator[WriteConflictInjection]:
    """Within the block, the next `count` UpdateItem calls on an item whose partition key starts
    with `prefix` fail with TransactionConflictException, as while a transaction holds the item."""
    raise_armed_conflicts()
    injection = WriteConflictInjection(prefix, count)
    with _lock:
        _armed_writes.append(injection)
    try:
        yield injection
    finally:
        with _lock:
            _armed_writes.remove(injection)


def _take_write(key: dict[str, Any]) -> bool:
    pk = str(next(iter((key.get("pk") or {"S": ""}).values())))
    with _lock:
        for injection in _armed_writes:
            if injection.remaining > 0 and pk.startswith(injection.prefix):
                injection.remaining -= 1
                injection.failed.append(pk)
                return True
    return False


def _take(transact_items: Sequence[dict[str, Any]]) -> ConflictInjection | None:
    with _lock:
        for injection in _armed:
            if injection.matches(transact_items):
                injection.remaining -= 1
                injection.failed.append(key_prefixes(transact_items))
                return injection
    return None


def raise_armed_conflicts() -> None:
    """moto 5.2.5 never cancels a transaction for a conflict, nor refuses a write for an ongoing
    transaction (its actions run one at a time here): the conflicts a test arms above are raised
    from inside its DynamoDB backend, as DynamoDB raises them (module docstring). Wraps the backend
    once per process; inert until a switch is armed."""
    import moto.dynamodb.models as dynamodb_models
    from moto.dynamodb.exceptions import ERROR_TYPE_PREFIX, DynamodbException, TransactionCanceledException

    backend = dynamodb_models.DynamoDBBackend
    if getattr(backend, "_relevo_conflict_faults", False):
        return
    original = backend.transact_write_items
    original_update_item = backend.update_item

    def update_item(self: Any, table_name: str, key: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if _take_write(key):
            # moto 5.2.5 has no class for this error: its generic one with DynamoDB's error type.
            raise DynamodbException(
                ERROR_TYPE_PREFIX + "TransactionConflictException",
                "Operation was rejected because there is an ongoing transaction for the item",
            )
        return original_update_item(self, table_name, key, *args, **kwargs)

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        injection = _take(transact_items)
        if injection is not None:
            raise TransactionCanceledException(
                [
                    (CONFLICT_CODE, CONFLICT_MESSAGE, None)
                    if index == injection.conflict_on
                    else (None, None, None)
                    for index in range(len(transact_items))
                ]
            )
        return original(self, transact_items)

    backend.transact_write_items = transact_write_items
    backend.update_item = update_item
    backend._relevo_conflict_faults = True
