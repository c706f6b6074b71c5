"""The project's line: the jobs that wait for its lock, in the waiting order (priority, then
queue_seq: WaitOrderIndex). A waiter joins the line, parks with a task token kept on its job
record, and reads the lock again when woken or at its fallback; the head takes the freed lock.
Whoever frees the lock, or leaves the line, wakes the head (wake_head)."""

from __future__ import annotations

from typing import Any

from relevo_core.models.status import JobStatus, QueueReason
from relevo_core.store import keys
from relevo_tools.job_machine.asl import (
    EXECUTION_NAME,
    ME,
    NOW,
    STATUS,
    TABLE,
    WRITER,
    States,
    get,
    job_key,
    lock_key,
    string_at,
    transaction,
    update,
)
from relevo_tools.job_machine.lock_writes import (
    ACQUIRE,
    ACQUIRE_VALUES,
    COUNT,
    GATE,
    HAS_ROOM,
    LEAVE_QUEUE,
    gives_back_queue_slot,
)

NOT_QUEUED = "NoLongerQueued"


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


def wait_in_line(*, took_lock: str, refused: str, gave_up: str) -> States:
    """A job whose first try at the lock was refused while others hold or wait for it: it takes a
    place in line, parks until woken (or its fallback read), and as the head of the line takes the
    freed lock (on to `took_lock`; a refusal goes back to `refused`, which reads the holders). A
    job that waited its whole queue timeout gives up and fails (on to `gave_up`, the dead letter);
    one canceled meanwhile ends at NOT_QUEUED."""
    states: States = {}
    states |= transaction(
        "MarkWaitingForProject",
        [
            {
                "Update": update(
                    job_key(),
                    f"SET queue_reason = :reason, {keys.WAITING_FOR_ATTRIBUTE} = :project, last_writer = "
                    ":writer, updated_at = :now",
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
        comment="Projection and place in line, atomically: the job waits because its project is running "
        "another job, joins the "
        "lock's waiters (which stops newcomers taking a freed lock first) and becomes visible in "
        "WaitOrderIndex. The lock's "
        "wake_seq (what a parked waiter checks has not moved, see WaitForProject) starts at 0. Refused when "
        "the job is no "
        "longer queued (canceled meanwhile).",
        canceled_comment="Cancelled: a conflict (the cancellation reasons, which DynamoDB lists in the "
        "message Step Functions gives "
        "as the Cause, name TransactionConflict or ThrottlingError) is retried; anything else is the job's "
        "condition: it is no "
        "longer queued.",
        result_selector={"since.$": "$$.State.EnteredTime"},
        result_path="$.waiting",
        next_state="PeekProjectLock",
        refused=NOT_QUEUED,
    )
    states |= {
        "PeekProjectLock": {
            "Type": "Task",
            "Comment": "A waiter reads the lock item (one strongly consistent GetItem): whether it is free, "
            "its wake_seq, which "
            "the waiter parks on, and whether its holder waits at its approval gate. It asks who goes next "
            "only once the lock is "
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
            "Who goes next: the first job of the project's waiting order (priority desc, then queue_seq "
            "asc).",
        ),
        "IsQueueHead": {
            "Type": "Choice",
            "Comment": "Only the head may take the lock. An empty answer (the index lags behind the write "
            "that made this job a "
            "waiter) lets the job try: the lock write stays conditional, so exclusion never rests on the "
            "index.",
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
        comment="Park until woken. The job's record keeps this task's token (wake_token): whoever frees the "
        "lock or leaves the "
        "line (the releasing execution, cancel, the sweeper) sends it back to the first job of the waiting "
        "order, which then "
        "reads the lock again. Parking is refused when the lock's wake_seq moved since the waiter read it "
        "(a release or a "
        "departure came in between, whose wake it would have missed) and when the job is no longer queued. "
        "TimeoutSeconds is "
        "the slow fallback for a wake that never comes; every park, woken or not, spends one of the job's "
        "lock_wait cycles, so "
        "the history a wait costs is bounded (see intake.lock_wait).",
        canceled_comment="Refused to park: a conflict is retried; the job's own condition (the second item) "
        "means it left the "
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
        comment="Park while the job holding the lock waits at its approval gate: the queue timeout is the "
        "wait for a Mac, and "
        "a person's sign-off is not, so this park spends none of the lock_wait cycles but one of the job's "
        "gate_wait parks, "
        "each gate_wait.park_sec long. A release wakes it as it wakes WaitForProject (the same wake_token); "
        "an approval does "
        "not, so the queue timeout counts again from the next read of the lock. With the gate_wait parks "
        "spent, a gated "
        "holder's wait counts like any other (IsLockFree), which bounds the history.",
        canceled_comment="Refused to park: a conflict is retried; the job's own condition (the second item) "
        "means it left the "
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
                    "SET #status = :failed, error_name = :error, error_cause = :cause, last_writer = "
                    ":writer, updated_at = :now, "
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
            gives_back_queue_slot(),
            {
                "Update": update(
                    lock_key(),
                    "DELETE waiters :me ADD wake_seq :one",
                    condition="contains(waiters, :name)",
                    values={":me": ME, ":name": {"S.$": EXECUTION_NAME}, ":one": {"N": "1"}},
                )
            },
        ],
        comment="The job fails, leaves the line and gives back its queue slot, atomically; then it is "
        "dead-lettered like any "
        "failed job (it can be redriven), and the next waiter is woken.",
        canceled_comment="Cancelled: a conflict is retried; anything else means the job left the queue "
        "(canceled) meanwhile.",
        next_state=gave_up,
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
        canceled_comment="Cancelled: a conflict is retried (and after the last retry the lock is read "
        "again); anything else is a "
        "refusal: read who holds the lock.",
        kept_conflicting=refused,
        next_state=took_lock,
        refused=refused,
    )
    states |= {
        NOT_QUEUED: {
            "Type": "Fail",
            "Comment": "Canceled while it waited for its project: cancel stops this execution; nothing more "
            "to do.",
            "Error": "Relevo.Job.NotQueued",
            "Cause": "the job left the queue while it waited for its project",
        },
    }
    return states


def wake_head(*, succeeded: str, failed: str) -> States:
    """Wake the head of the project's line, if anyone waits, then on to `succeeded`, or to
    `failed` for a job that failed ($.error). A wake that fails only delays the head until its
    fallback read of the lock."""
    return {
        "FindHeadToWake": _wait_order_head(
            "$.wake",
            "IsAnyoneWaiting",
            "Who heads the project's line now (priority desc, then queue_seq asc), to be woken. A wake that "
            "fails here only "
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
            "Comment": "No token: the head is between two parks, and it reads the lock before it parks "
            "again.",
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
            "Comment": "The head's park returns and it reads the lock. A token that is no longer live (the "
            "head parked again, or "
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
