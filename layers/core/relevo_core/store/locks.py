"""Access pattern: the per-project lock (a DynamoDB semaphore the state machine takes and gives
back), taken by intake in a new job's transaction when it is free, seen from the sweeper, which
frees holders whose execution has ended, and from the views, which say whose approval gate a
queued job waits behind."""

from __future__ import annotations

from typing import Any

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes
from relevo_core.store.conditional import update_if
from relevo_core.store.keys import LOCK_KIND, LOCK_SK, key, lock_pk
from relevo_core.store.kinds import items_of_kind


def lock_holders(table: str) -> dict[str, list[str]]:
    """Project id -> execution names holding its lock."""
    return _named_in(table, "holders")


def lock_waiters(table: str) -> dict[str, list[str]]:
    """Project id -> job ids (= execution names) waiting for its lock."""
    return _named_in(table, "waiters")


def _named_in(table: str, attribute: str) -> dict[str, list[str]]:
    named: dict[str, list[str]] = {}
    for record in items_of_kind(table, LOCK_KIND):
        names = sorted(record.get(attribute) or [])
        if names:
            named[record["pk"].removeprefix("LOCK#")] = names
    return named


def acquire_if_free(table: str, project_id: str, execution_name: str) -> dict[str, Any]:
    """The lock taken for `execution_name` as a TransactWriteItems Update: the very write of
    job.asl.json's first try (tools/relevo_tools/job_machine/lock_writes.py ACQUIRE, HAS_ROOM),
    refused unless the lock has room and nobody waits for it, so a new job never overtakes a
    waiting one. Its refusal comes back without the item: the caller then queues the job."""
    return {
        "Update": {
            "TableName": table,
            "Key": key(lock_pk(project_id), LOCK_SK),
            "UpdateExpression": "SET #count = if_not_exists(#count, :zero) + :one, kind = :kind "
            "REMOVE gate ADD holders :me",
            "ConditionExpression": "(attribute_not_exists(#count) OR #count < :limit) "
            "AND NOT contains(holders, :name) AND attribute_not_exists(waiters)",
            "ExpressionAttributeNames": {"#count": "count"},
            "ExpressionAttributeValues": {
                ":zero": {"N": "0"},
                ":one": {"N": "1"},
                ":limit": {"N": "1"},
                ":kind": {"S": LOCK_KIND},
                ":me": {"SS": [execution_name]},
                ":name": {"S": execution_name},
            },
        }
    }


def release(table: str, project_id: str, execution_name: str) -> bool:
    """Give back the slot `execution_name` holds, exactly as the state machine would (moving the
    lock's wake_seq, so a waiter about to park reads the lock again); False if it no longer holds
    it. The caller then wakes the head of the line (relevo_core.projects.lock_handoff)."""
    return update_if(
        TableName=table,
        Key=key(lock_pk(project_id), LOCK_SK),
        # Its holder no longer waits at an approval gate either (job.asl.json's AwaitApproval writes `gate`).
        UpdateExpression="ADD #count :minus_one, wake_seq :one DELETE holders :me REMOVE gate",
        ConditionExpression="contains(holders, :name)",
        ExpressionAttributeNames={"#count": "count"},
        ExpressionAttributeValues={
            ":minus_one": {"N": "-1"},
            ":one": {"N": "1"},
            ":me": {"SS": [execution_name]},
            ":name": {"S": execution_name},
        },
    )


def approval_gate(table: str, project_id: str) -> dict[str, Any] | None:
    """`{job_id, stage, since}` while the job holding the project's lock waits at its approval
    gate (job.asl.json's AwaitApproval writes it on the lock, MarkApproved and every release take
    it off); None otherwise. One GetItem, eventually consistent: a view may say the gate a moment
    after it was answered. A gate whose job no longer holds the lock says nothing."""
    item = (
        client("dynamodb")
        .get_item(
            TableName=table,
            Key=key(lock_pk(project_id), LOCK_SK),
            ProjectionExpression="gate, holders",
        )
        .get("Item")
    )
    lock = from_attributes(item) if item else {}
    gate = lock.get("gate")
    if not gate or gate.get("job_id") not in (lock.get("holders") or set()):
        return None
    return {"job_id": gate["job_id"], "stage": gate.get("stage"), "since": gate.get("since")}
