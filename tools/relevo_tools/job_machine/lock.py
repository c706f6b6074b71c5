"""The project lock: one job of a project runs at a time, the others wait in line.

A DynamoDB semaphore with limit 1 (AWS's Step Functions semaphore pattern) whose holder set names
executions, so acquiring is re-entrant and a sweep can free the lock of an execution that ended.
Waiters join the lock's `waiters` and the sparse WaitOrderIndex, park with a task token kept on
their job record, and are woken by whoever frees the lock or leaves the line.
"""

from __future__ import annotations

from typing import Any

from relevo_core.models.status import JobStatus, QueueReason
from relevo_core.store import keys
from relevo_tools.job_machine.asl import (
    EXECUTION_NAME,
    KEPT_CONFLICTING,
    ME,
    NOW,
    STATUS,
    TABLE,
    WRITER,
    States,
    backoff_retry,
    get,
    job_key,
    lock_key,
    queue_counter_key,
    string_at,
    transaction,
    update,
)

NOT_QUEUED = "NoLongerQueued"
# The job leaves the queue: what intake and the wait wrote for a queued job goes.
LEAVE_QUEUE = f"REMOVE {keys.START_PENDING_ATTRIBUTE}, queue_reason, {keys.WAITING_FOR_ATTRIBUTE}, {keys.WAKE_TOKEN_ATTRIBUTE}"
COUNT = {"#count": "count"}
# The lock's `gate`: the holder waits at its approval gate ({job_id, stage, since}), written by
# AwaitApproval and taken off by MarkApproved (stage.py), by every release, and by an acquire
# (a lock with room has no holder whose gate it could be). A job queued behind such a holder
# parks in WaitBehindGate, which spends none of its queue timeout (execution.gate_wait).
GATE = "gate"
# Acquiring: one more holder, this execution, while the lock has room and this execution is not a holder yet.
ACQUIRE = f"SET #count = if_not_exists(#count, :zero) + :one, kind = :kind REMOVE {GATE} ADD holders :me"
HAS_ROOM = "(attribute_not_exists(#count) OR #count < :limit) AND NOT contains(holders, :name)"
ACQUIRE_VALUES = {
    ":zero": {"N": "0"},
    ":one": {"N": "1"},
    ":limit": {"N": "1"},
    ":kind": {"S": keys.LOCK_KIND},
    ":me": ME,
    ":name": {"S.$": EXECUTION_NAME},
}
RELEASE = f"ADD #count :minus_one, wake_seq :one DELETE holders :me REMOVE {GATE}"
HOLDS = "contains(holders, :name)"
RELEASE_VALUES = {":minus_one": {"N": "-1"}, ":me": ME, ":name": {"S.$": EXECUTION_NAME}, ":one": {"N": "1"}}


def _starts_running() -> dict[str, Any]:
    """The job record: queued → running, out of the queue."""
    return {
        "Update": update(
            job_key(),
            f"SET #status = :running, last_writer = :writer, updated_at = :now {LEAVE_QUEUE}",
            condition="#status = :queued",
            names=STATUS,
            values={
                ":running": {"S": JobStatus.RUNNING.value},
                ":queued": {"S": JobStatus.QUEUED.value},
                ":writer": WRITER,
                ":now": NOW,
            },
        )
    }


def _gives_back_queue_slot() -> dict[str, Any]:
    return {
        "Update": update(queue_counter_key(), "ADD queued :minus_one", values={":minus_one": {"N": "-1"}})
    }


def _wait_order_head(result_path: str, next_state: str, comment: str, **extra: Any) -> dict[str, Any]:
    """The first job of the project's waiting order (priority desc, then queue_seq asc)."""
    return {
        "Type": "Task",
        "Comment": comment,
        "Resource": "arn:aws:states:::aws-sdk:dynamodb:query",
        "Parameters": {
            "TableName": TABLE,
            "IndexName": keys.WAIT_ORDER_INDEX,
            "KeyConditionExpression": f"{keys.WAITING_FOR_ATTRIBUTE} = :project",
            "ExpressionAttributeValues": {":project": string_at("$.project")},
            "Limit": 1,
            "ProjectionExpression": "job_id",
        },
        "ResultSelector": {"count.$": "$.Count", "items.$": "$.Items"},
        "ResultPath": result_path,
        **extra,
        "Next": next_state,
    }


def _park() -> list[dict[str, Any]]:
    """A waiter's park: conditional on the lock's wake_seq it last read, its task token kept on
    its record (wake_token) for whoever frees the lock, while the job is queued."""
    return [
        {
            "ConditionCheck": {
                "TableName": TABLE,
                "Key": lock_key(),
                "ConditionExpression": "wake_seq = :seen",
                "ExpressionAttributeValues": {":seen": {"N.$": "$.peek.Item.wake_seq.N"}},
            }
        },
        {
            "Update": update(
                job_key(),
                f"SET {keys.WAKE_TOKEN_ATTRIBUTE} = :token",
                condition="#status = :queued",
                names=STATUS,
                values={":token": {"S.$": "$$.Task.Token"}, ":queued": {"S": JobStatus.QUEUED.value}},
            )
        },
    ]


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
            _starts_running(),
            _gives_back_queue_slot(),
        ],
        comment="Same-project serial: a DynamoDB semaphore with limit 1 (AWS's Step Functions semaphore pattern) whose holder set "
        "names executions, so acquiring is re-entrant and a sweep can free the lock of an execution that ended. In the same "
        "transaction the job leaves the queue (status, sweeper marker) and gives back its queue slot. This first try succeeds "
        "only while no job waits for the project (no `waiters`): a newcomer never overtakes a waiting job.",
        canceled_comment="Cancelled: a conflict is retried; anything else is a refusal (another job holds the lock, others wait "
        "for it, this execution holds it already, or the job is no longer queued): read who holds the lock.",
        next_state=first_stage,
        refused="CheckLockHolder",
    )
    states |= {
        "CheckLockHolder": {
            "Type": "Task",
            "Comment": "Refused: either another job of the project runs, this execution already holds the lock (a retried start), "
            "the lock is free but others wait for it, or the job left the queue. A free lock has no holders attribute at all "
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
    states |= transaction(
        "MarkWaitingForProject",
        [
            {
                "Update": update(
                    job_key(),
                    f"SET queue_reason = :reason, {keys.WAITING_FOR_ATTRIBUTE} = :project, last_writer = :writer, updated_at = :now",
                    condition="#status = :queued",
                    names=STATUS,
                    values={
                        ":reason": {"S": QueueReason.PROJECT_RUNNING.value},
                        ":project": string_at("$.project"),
                        ":queued": {"S": JobStatus.QUEUED.value},
                        ":writer": WRITER,
                        ":now": NOW,
                    },
                )
            },
            {
                "Update": update(
                    lock_key(),
                    "SET wake_seq = if_not_exists(wake_seq, :zero) ADD waiters :me",
                    values={":zero": {"N": "0"}, ":me": ME},
                )
            },
        ],
        comment="Projection and place in line, atomically: the job waits because its project is running another job, joins the "
        "lock's waiters (which stops newcomers taking a freed lock first) and becomes visible in WaitOrderIndex. The lock's "
        "wake_seq (what a parked waiter checks has not moved, see WaitForProject) starts at 0. Refused when the job is no "
        "longer queued (canceled meanwhile).",
        canceled_comment="Cancelled: a conflict (the cancellation reasons, which DynamoDB lists in the message Step Functions gives "
        "as the Cause, name TransactionConflict or ThrottlingError) is retried; anything else is the job's condition: it is no "
        "longer queued.",
        result_selector={"since.$": "$$.State.EnteredTime"},
        result_path="$.waiting",
        next_state="PeekProjectLock",
        refused=NOT_QUEUED,
    )
    states |= {
        "PeekProjectLock": {
            "Type": "Task",
            "Comment": "A waiter reads the lock item (one strongly consistent GetItem): whether it is free, its wake_seq, which "
            "the waiter parks on, and whether its holder waits at its approval gate. It asks who goes next only once the lock is "
            "free: the index query runs once per waiter per handoff, not on every read.",
            "Resource": "arn:aws:states:::dynamodb:getItem",
            "Parameters": get(lock_key(), f"#count, wake_seq, {GATE}", COUNT),
            "ResultPath": "$.peek",
            "Next": "IsLockFree",
        },
        "IsLockFree": {
            "Type": "Choice",
            "Choices": [
                {"Variable": "$.peek.Item.count.N", "IsPresent": False, "Next": "FindQueueHead"},
                {"Variable": "$.peek.Item.count.N", "StringEquals": "0", "Next": "FindQueueHead"},
                {
                    "And": [
                        {"Variable": f"$.peek.Item.{GATE}", "IsPresent": True},
                        {"Variable": "$.gate_wait.parks", "NumericGreaterThan": 0},
                    ],
                    "Next": "WaitBehindGate",
                },
            ],
            "Default": "WaitForProject",
        },
        "FindQueueHead": _wait_order_head(
            "$.queue",
            "IsQueueHead",
            "Who goes next: the first job of the project's waiting order (priority desc, then queue_seq asc).",
        ),
        "IsQueueHead": {
            "Type": "Choice",
            "Comment": "Only the head may take the lock. An empty answer (the index lags behind the write that made this job a "
            "waiter) lets the job try: the lock write stays conditional, so exclusion never rests on the index.",
            "Choices": [
                {"Variable": "$.queue.count", "NumericEquals": 0, "Next": "AcquireAsQueueHead"},
                {
                    "Variable": "$.queue.items[0].job_id.S",
                    "StringEqualsPath": "$.job_id",
                    "Next": "AcquireAsQueueHead",
                },
            ],
            "Default": "WaitForProject",
        },
    }
    states |= transaction(
        "WaitForProject",
        _park(),
        comment="Park until woken. The job's record keeps this task's token (wake_token): whoever frees the lock or leaves the "
        "line (the releasing execution, cancel, the sweeper) sends it back to the first job of the waiting order, which then "
        "reads the lock again. Parking is refused when the lock's wake_seq moved since the waiter read it (a release or a "
        "departure came in between, whose wake it would have missed) and when the job is no longer queued. TimeoutSeconds is "
        "the slow fallback for a wake that never comes; every park, woken or not, spends one of the job's lock_wait cycles, so "
        "the history a wait costs is bounded (see intake.lock_wait).",
        canceled_comment="Refused to park: a conflict is retried; the job's own condition (the second item) means it left the "
        "queue; otherwise the lock's wake_seq moved since it was read, so the waiter reads it again.",
        waits_for_token=True,
        timeout_path="$.lock_wait.fallback_sec",
        before_catch=[{"ErrorEquals": ["States.Timeout"], "ResultPath": None, "Next": "CountWaitCycle"}],
        # The reasons list the items in order: a failed condition on the job's (second) item.
        refusals=[
            {
                "Variable": "$.conflict.error.Cause",
                "StringMatches": "*, ConditionalCheckFailed]*",
                "Next": NOT_QUEUED,
            }
        ],
        kept_conflicting="CountWaitCycle",
        next_state="CountWaitCycle",
        refused="CountWaitCycle",
    )
    states |= transaction(
        "WaitBehindGate",
        _park(),
        comment="Park while the job holding the lock waits at its approval gate: the queue timeout is the wait for a Mac, and "
        "a person's sign-off is not, so this park spends none of the lock_wait cycles but one of the job's gate_wait parks, "
        "each gate_wait.park_sec long. A release wakes it as it wakes WaitForProject (the same wake_token); an approval does "
        "not, so the queue timeout counts again from the next read of the lock. With the gate_wait parks spent, a gated "
        "holder's wait counts like any other (IsLockFree), which bounds the history.",
        canceled_comment="Refused to park: a conflict is retried; the job's own condition (the second item) means it left the "
        "queue; otherwise the lock's wake_seq moved since it was read, so the waiter reads it again.",
        waits_for_token=True,
        timeout_path="$.gate_wait.park_sec",
        before_catch=[{"ErrorEquals": ["States.Timeout"], "ResultPath": None, "Next": "CountGateCycle"}],
        refusals=[
            {
                "Variable": "$.conflict.error.Cause",
                "StringMatches": "*, ConditionalCheckFailed]*",
                "Next": NOT_QUEUED,
            }
        ],
        kept_conflicting="CountGateCycle",
        next_state="CountGateCycle",
        refused="CountGateCycle",
    )
    states |= {
        "CountGateCycle": {
            "Type": "Pass",
            "Parameters": {
                "park_sec.$": "$.gate_wait.park_sec",
                "parks.$": "States.MathAdd($.gate_wait.parks, -1)",
            },
            "ResultPath": "$.gate_wait",
            "Next": "PeekProjectLock",
        },
        "CountWaitCycle": {
            "Type": "Pass",
            "Parameters": {
                "fallback_sec.$": "$.lock_wait.fallback_sec",
                "cycles.$": "States.MathAdd($.lock_wait.cycles, -1)",
            },
            "ResultPath": "$.lock_wait",
            "Next": "WaitBudgetLeft",
        },
        "WaitBudgetLeft": {
            "Type": "Choice",
            "Choices": [
                {"Variable": "$.lock_wait.cycles", "NumericGreaterThan": 0, "Next": "PeekProjectLock"}
            ],
            "Default": "ProjectWaitTimedOut",
        },
        "ProjectWaitTimedOut": {
            "Type": "Pass",
            "Comment": "The job waited for its project for its whole queue_timeout_sec.",
            "Result": {
                "Error": "Relevo.Timeout.Queue",
                "Cause": "the project stayed busy for the whole queue_timeout_sec",
            },
            "ResultPath": "$.error",
            "Next": "GiveUpWaiting",
        },
    }
    states |= transaction(
        "GiveUpWaiting",
        [
            {
                "Update": update(
                    job_key(),
                    "SET #status = :failed, error_name = :error, error_cause = :cause, last_writer = :writer, updated_at = :now, "
                    f"ended_at = :now {LEAVE_QUEUE}",
                    condition="#status = :queued",
                    names=STATUS,
                    values={
                        ":failed": {"S": JobStatus.FAILED.value},
                        ":queued": {"S": JobStatus.QUEUED.value},
                        ":error": string_at("$.error.Error"),
                        ":cause": string_at("$.error.Cause"),
                        ":writer": WRITER,
                        ":now": NOW,
                    },
                )
            },
            _gives_back_queue_slot(),
            {
                "Update": update(
                    lock_key(),
                    "DELETE waiters :me ADD wake_seq :one",
                    condition="contains(waiters, :name)",
                    values={":me": ME, ":name": {"S.$": EXECUTION_NAME}, ":one": {"N": "1"}},
                )
            },
        ],
        comment="The job fails, leaves the line and gives back its queue slot, atomically; then it is dead-lettered like any "
        "failed job (it can be redriven), and the next waiter is woken.",
        canceled_comment="Cancelled: a conflict is retried; anything else means the job left the queue (canceled) meanwhile.",
        next_state="ReadJobForDeadLetter",
        refused=NOT_QUEUED,
    )
    states |= transaction(
        "AcquireAsQueueHead",
        [
            {
                "Update": update(
                    lock_key(),
                    f"{ACQUIRE} DELETE waiters :me",
                    condition=HAS_ROOM,
                    names=COUNT,
                    values=ACQUIRE_VALUES,
                )
            },
            {
                "Update": update(
                    job_key(), f"REMOVE {keys.WAITING_FOR_ATTRIBUTE}, {keys.WAKE_TOKEN_ATTRIBUTE}"
                )
            },
        ],
        comment="The head takes the freed lock and leaves the waiting order in one transaction.",
        canceled_comment="Cancelled: a conflict is retried (and after the last retry the lock is read again); anything else is a "
        "refusal: read who holds the lock.",
        kept_conflicting="CheckLockHolder",
        next_state="MarkStarted",
        refused="CheckLockHolder",
    )
    states |= {
        NOT_QUEUED: {
            "Type": "Fail",
            "Comment": "Canceled while it waited for its project: cancel stops this execution; nothing more to do.",
            "Error": "Relevo.Job.NotQueued",
            "Cause": "the job left the queue while it waited for its project",
        },
        KEPT_CONFLICTING: {
            "Type": "Fail",
            "Comment": "A transaction that never applied: the job is as it was (queued), and the sweep ends the job of this failed "
            "execution, giving back its slot, lock and place in line.",
            "Error": "Relevo.Transaction.Conflict",
            "Cause": "a DynamoDB transaction of the job kept conflicting with other writes",
        },
    }
    states |= transaction(
        "MarkStarted",
        [_starts_running(), _gives_back_queue_slot()],
        comment="Projection, atomically, for a job that took the lock as the head of the line or already held it: the job leaves "
        "the queue (status, sweeper marker) and gives back its queue slot. Refused when the job is no longer queued, so a slot "
        "is returned once.",
        canceled_comment="Cancelled: a conflict is retried; anything else is the job's condition: it is not queued any more "
        "because an earlier attempt of this state was applied, so the stages run and the slot is not given back twice.",
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


def wake_head(*, succeeded: str, failed: str) -> States:
    """Wake the head of the project's line, if anyone waits, then on to `succeeded`, or to
    `failed` for a job that failed ($.error). A wake that fails only delays the head until its
    fallback read of the lock."""
    return {
        "FindHeadToWake": _wait_order_head(
            "$.wake",
            "IsAnyoneWaiting",
            "Who heads the project's line now (priority desc, then queue_seq asc), to be woken. A wake that fails here only "
            "delays the head until its fallback read of the lock.",
            Catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "AfterWake"}],
        ),
        "IsAnyoneWaiting": {
            "Type": "Choice",
            "Comment": "Nobody waits (the common case): straight on, one transition.",
            "Choices": [
                {
                    "And": [
                        {"Variable": "$.wake.count", "NumericEquals": 0},
                        {"Variable": "$.error", "IsPresent": False},
                    ],
                    "Next": succeeded,
                },
                {"Variable": "$.wake.count", "NumericEquals": 0, "Next": failed},
            ],
            "Default": "ReadHeadWakeToken",
        },
        "ReadHeadWakeToken": {
            "Type": "Task",
            "Resource": "arn:aws:states:::dynamodb:getItem",
            "Parameters": get(job_key("$.wake.items[0].job_id.S"), keys.WAKE_TOKEN_ATTRIBUTE),
            "ResultPath": "$.wake.head",
            "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "AfterWake"}],
            "Next": "HasWakeToken",
        },
        "HasWakeToken": {
            "Type": "Choice",
            "Comment": "No token: the head is between two parks, and it reads the lock before it parks again.",
            "Choices": [
                {
                    "Variable": f"$.wake.head.Item.{keys.WAKE_TOKEN_ATTRIBUTE}.S",
                    "IsPresent": True,
                    "Next": "WakeHead",
                }
            ],
            "Default": "AfterWake",
        },
        "WakeHead": {
            "Type": "Task",
            "Comment": "The head's park returns and it reads the lock. A token that is no longer live (the head parked again, or "
            "ended) is refused, which changes nothing.",
            "Resource": "arn:aws:states:::aws-sdk:sfn:sendTaskSuccess",
            "Parameters": {
                "TaskToken.$": f"$.wake.head.Item.{keys.WAKE_TOKEN_ATTRIBUTE}.S",
                "Output": '{"woken": true}',
            },
            "ResultPath": None,
            "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "AfterWake"}],
            "Next": "AfterWake",
        },
        "AfterWake": {
            "Type": "Choice",
            "Choices": [{"Variable": "$.error", "IsPresent": True, "Next": failed}],
            "Default": succeeded,
        },
    }
