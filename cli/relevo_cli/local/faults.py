"""Faults AWS produces that the local stack would never produce by itself, switched on by tests.

The local stack applies DynamoDB requests one at a time (see stack._emulator_server), so two
transactions never overlap and DynamoDB's optimistic concurrency never cancels one. On AWS a
`TransactWriteItems` that overlaps another transaction or write on one of its items is cancelled
with `TransactionCanceledException`, the item's cancellation reason being `TransactionConflict`
(DynamoDB API Reference, TransactWriteItems, Errors; Developer Guide, "Transaction conflict
handling in DynamoDB"). It never fails with `TransactionConflictException`: that is the error
of a single-item write that meets an ongoing transaction.

`transaction_conflicts` makes the next N matching `TransactWriteItems` calls fail that way. It
acts inside moto's DynamoDB backend (moto 5.2.5: `DynamoDBBackend.transact_write_items`, in
this process, like the other emulator patches in stack.py) and raises moto's own
`TransactionCanceledException` before anything is written, so the error goes through moto's
real response path (HTTP 400, `CancellationReasons`, the message listing the reasons) and
through the Step Functions interpreter's real error mapping (`DynamoDb.TransactionCanceledException`,
the message as the Cause).

A call matches by the partition-key prefixes of its items, in order: ("JOB#", "COUNTER#") is
MarkStarted's transaction. The Step Functions interpreter's calls are not told apart by caller:
its credentials are an emulator detail (moto 5.2.5 signs them with a fixed key) that the local
stack may change, while the items a transaction names identify the state exactly.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

CONFLICT_CODE = "TransactionConflict"
# DynamoDB's message for this reason (CancellationReason.Message).
CONFLICT_MESSAGE = "Transaction is ongoing for the item"


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
    failed: list[tuple[str, ...]] = field(default_factory=list)

    def matches(self, transact_items: Sequence[dict[str, Any]]) -> bool:
        return self.remaining > 0 and key_prefixes(transact_items) == self.prefixes


_lock = threading.Lock()
_armed: list[ConflictInjection] = []


@contextmanager
def transaction_conflicts(count: int, prefixes: Sequence[str], conflict_on: int = 0) -> Iterator[ConflictInjection]:
    """Within the block, the next `count` TransactWriteItems calls whose items' partition keys
    start with `prefixes` (in order) are cancelled, item `conflict_on` with reason
    TransactionConflict and the others with None, as DynamoDB reports them."""
    install()
    injection = ConflictInjection(tuple(prefixes), count, conflict_on)
    with _lock:
        _armed.append(injection)
    try:
        yield injection
    finally:
        with _lock:
            _armed.remove(injection)


def _take(transact_items: Sequence[dict[str, Any]]) -> ConflictInjection | None:
    with _lock:
        for injection in _armed:
            if injection.matches(transact_items):
                injection.remaining -= 1
                injection.failed.append(key_prefixes(transact_items))
                return injection
    return None


def install() -> None:
    """Wrap the emulator's DynamoDB backend once per process; inert until a switch is armed."""
    import moto.dynamodb.models as dynamodb_models
    from moto.dynamodb.exceptions import TransactionCanceledException

    backend = dynamodb_models.DynamoDBBackend
    if getattr(backend, "_relevo_conflict_faults", False):
        return
    original = backend.transact_write_items

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        injection = _take(transact_items)
        if injection is not None:
            raise TransactionCanceledException(
                [
                    (CONFLICT_CODE, CONFLICT_MESSAGE, None) if index == injection.conflict_on else (None, None, None)
                    for index in range(len(transact_items))
                ]
            )
        return original(self, transact_items)

    backend.transact_write_items = transact_write_items
    backend._relevo_conflict_faults = True
