"""The project lock: one job of a project runs at a time, the others wait in line.

A DynamoDB semaphore with limit 1 (AWS's Step Functions semaphore pattern) whose holder set names
executions, so acquiring is re-entrant and a sweep can free the lock of an execution that ended.
Waiters join the lock's `waiters` and the sparse WaitOrderIndex, park with a task token kept on
their job record, and are woken by whoever frees the lock or leaves the line (lock_line.py).
"""

from __future__ import annotations

from relevo_tools.job_machine.asl import (
    EXECUTION_NAME,
    KEPT_CONFLICTING,
    States,
    backoff_retry,
    get,
    lock_key,
    transaction,
    update,
)
from relevo_tools.job_machine.lock_line import wait_in_line
from relevo_tools.job_machine.lock_writes import (
    ACQUIRE,
    ACQUIRE_VALUES,
    COUNT,
    HAS_ROOM,
    HOLDS,
    RELEASE,
    RELEASE_VALUES,
    gives_back_queue_slot,
    starts_running,
)


def acquire(first_stage: str) -> States:
    """From the execution's start to `first_stage`, the lock held and the job running; or a
    place in line, parks until woken, and the head of the line taking the lock."""
    states: States = {}
    states |= transaction(
        "AcquireProjectLockAndStart",
        [
            {
                "Update": update(
                    lock_key(),
                    ACQUIRE,
                    condition=f"{HAS_ROOM} AND attribute_not_exists(waiters)",
                    names=COUNT,
                    values=ACQUIRE_VALUES,
                )
            },
            starts_running(),
            gives_back_queue_slot(),
        ],
        comment="Same-project serial: a DynamoDB semaphore with limit 1 (AWS's Step Functions semaphore "
        "pattern) whose holder set "
        "names executions, so acquiring is re-entrant and a sweep can free the lock of an execution that "
        "ended. In the same "
        "transaction the job leaves the queue (status, sweeper marker) and gives back its queue slot. This "
        "first try succeeds "
        "only while no job waits for the project (no `waiters`): a newcomer never overtakes a waiting job.",
        canceled_comment="Cancelled: a conflict is retried; anything else is a refusal (another job holds "
        "the lock, others wait "
        "for it, this execution holds it already, or the job is no longer queued): read who holds the lock.",
        next_state=first_stage,
        refused="CheckLockHolder",
    )
    states |= {
        "CheckLockHolder": {
            "Type": "Task",
            "Comment": "Refused: either another job of the project runs, this execution already holds the "
            "lock (a retried start), "
            "the lock is free but others wait for it, or the job left the queue. A free lock has no holders "
            "attribute at all "
            "(an empty set is not stored), so holders is read as present or absent before it is searched.",
            "Resource": "arn:aws:states:::dynamodb:getItem",
            "Parameters": get(lock_key(), "holders"),
            "ResultPath": "$.lock",
            "Next": "LockHasHolders",
        },
        "LockHasHolders": {
            "Type": "Choice",
            "Choices": [{"Variable": "$.lock.Item.holders.SS", "IsPresent": True, "Next": "ReadLockHolders"}],
            "Default": "NoLockHolders",
        },
        "ReadLockHolders": {
            "Type": "Pass",
            "Parameters": {"held.$": f"States.ArrayContains($.lock.Item.holders.SS, {EXECUTION_NAME})"},
            "ResultPath": "$.lock",
            "Next": "HoldsProjectLock",
        },
        "NoLockHolders": {
            "Type": "Pass",
            "Result": {"held": False},
            "ResultPath": "$.lock",
            "Next": "HoldsProjectLock",
        },
        "HoldsProjectLock": {
            "Type": "Choice",
            "Choices": [
                {"Variable": "$.lock.held", "BooleanEquals": True, "Next": "MarkStarted"},
                {"Variable": "$.waiting", "IsPresent": True, "Next": "PeekProjectLock"},
            ],
            "Default": "MarkWaitingForProject",
        },
    }
    states |= wait_in_line(took_lock="MarkStarted", refused="CheckLockHolder", gave_up="ReadJobForDeadLetter")
    states |= {
        KEPT_CONFLICTING: {
            "Type": "Fail",
            "Comment": "A transaction that never applied: the job is as it was (queued), and the sweep ends "
            "the job of this failed "
            "execution, giving back its slot, lock and place in line.",
            "Error": "Relevo.Transaction.Conflict",
            "Cause": "a DynamoDB transaction of the job kept conflicting with other writes",
        },
    }
    states |= transaction(
        "MarkStarted",
        [starts_running(), gives_back_queue_slot()],
        comment="Projection, atomically, for a job that took the lock as the head of the line or already "
        "held it: the job leaves "
        "the queue (status, sweeper marker) and gives back its queue slot. Refused when the job is no "
        "longer queued, so a slot "
        "is returned once.",
        canceled_comment="Cancelled: a conflict is retried; anything else is the job's condition: it is not "
        "queued any more "
        "because an earlier attempt of this state was applied, so the stages run and the slot is not given "
        "back twice.",
        next_state=first_stage,
        refused=first_stage,
    )
    return states


def release(name: str, comment: str, *, next_state: str) -> States:
    """This execution gives the lock back and moves its wake_seq (a waiter about to park sees
    it and reads the lock again); a lock it no longer holds (a sweep freed it) is left alone."""
    return {
        name: {
            "Type": "Task",
            "Comment": comment,
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": update(lock_key(), RELEASE, condition=HOLDS, names=COUNT, values=RELEASE_VALUES),
            "ResultPath": None,
            "Retry": [
                backoff_retry(
                    [
                        "DynamoDB.InternalServerErrorException",
                        "DynamoDB.ProvisionedThroughputExceededException",
                        "DynamoDB.RequestLimitExceeded",
                        "DynamoDB.TransactionConflictException",
                    ],
                    3,
                )
            ],
            "Catch": [
                {
                    "ErrorEquals": ["DynamoDB.ConditionalCheckFailedException"],
                    "ResultPath": None,
                    "Next": next_state,
                }
            ],
            "Next": next_state,
        }
    }
