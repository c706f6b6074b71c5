"""One stage of the plan: its approval gate, each attempt's dispatch to the region's queue, the
claim and the run, the failure of an attempt, its retry by error class, and the stage's end.

`stage_states()` makes every state of one stage; `run_stages()` runs them once per stage of the
plan, in order. A fan-out over a stage's shards wraps `stage_states()` the same way.
"""

from __future__ import annotations

from typing import Any

from relevo_core.execution import PAUSE_HOLD_SEC, RETRY_KEYS
from relevo_core.models.errors import ErrorClass
from relevo_core.models.stage_message import StageMessage
from relevo_core.models.status import JobStatus, StageStatus
from relevo_core.store import keys
from relevo_tools.job_machine.asl import (
    NOW,
    STATUS,
    TABLE,
    WRITER,
    State,
    States,
    backoff_retry,
    formatted,
    job_key,
    lock_key,
    number_at,
    stage_key,
    stage_token_sk,
    string_at,
    token_item,
    transaction,
    update,
)
from relevo_tools.job_machine.lock import GATE
from relevo_tools.job_machine.shards import fan_out

# The approval gate is the condition of the stage's dispatch write, picked by the stage's `gate`
# (relevo_core.execution.execution_input: 1 for the gated stage, else 0): the gated stage's write
# is refused until MarkApproved wrote approved_at on its record, and the refusal leads to the
# approval states; nothing writes approved_at on any other stage, so theirs always holds. A
# Choice before each dispatch would cost a state transition per stage of every job ("AWS Step
# Functions pricing": Standard workflows are billed per state transition). The intrinsic
# functions pick the text ("Intrinsic functions for JSONPath states in Step Functions":
# States.Array, States.ArrayGetItem), and a Parameters field ending in .$ takes it.
UNGATED, GATED = "attribute_not_exists(approved_at)", "attribute_exists(approved_at)"
# A stage with shards (gate 2 or 3: relevo_core.execution.FANS_OUT) is never dispatched as one:
# its write is always refused, and the refusal leads to its fan-out (GatedOrSharded), at no
# transition for a stage without shards.
FANS_OUT = "attribute_exists(pk) AND attribute_not_exists(pk)"
GATE_CONDITION = (
    f"States.ArrayGetItem(States.Array('{UNGATED}', '{GATED}', '{FANS_OUT}', '{FANS_OUT}'), $.stage.gate)"
)
# A shard stopped by a sibling's failure (StopShards closes its record) is not dispatched again.
SHARD_OPEN = "attribute_not_exists(closed_at)"
FAILURE_NAMES = {
    "QueueTimedOut": (ErrorClass.QUEUE_TIMEOUT, "no agent claimed the stage within queue_timeout_sec"),
    "LeaseExpired": (
        ErrorClass.LEASE_EXPIRED,
        "the claiming agent stopped heartbeating for longer than its lease",
    ),
    "ExecTimedOut": (
        ErrorClass.EXEC_TIMEOUT,
        "the stage ran past its exec timeout and the agent did not end it",
    ),
}


def _notify(event: str, next_state: str) -> State:
    return {
        "Type": "Task",
        "Resource": "arn:aws:states:::sns:publish",
        "Parameters": {
            "TopicArn": "${NotificationTopicArn}",
            "Subject": f"Relevo {event}",
            "Message": {
                "event": event,
                "job_id.$": "$.job_id",
                "project.$": "$.project",
                "stage.$": "$.stage.name",
            },
        },
        "ResultPath": None,
        "Next": next_state,
    }


def _failure(error: str, cause: str, next_state: str = "RecordAttemptFailure") -> State:
    return {
        "Type": "Pass",
        "Result": {"Error": error, "Cause": cause},
        "ResultPath": "$.failure",
        "Next": next_state,
    }


def _catch_all(next_state: str, result_path: str | None = "$.failure") -> dict[str, Any]:
    return {"ErrorEquals": ["States.ALL"], "ResultPath": result_path, "Next": next_state}


def approval_gate(approved: str) -> States:
    """The plan's approval gate, where the gated stage's first dispatch was refused: the job
    waits for POST /jobs/{id}/approve or /reject, then the stage goes on to `approved`; a
    rejection or a timeout fails the stage."""
    return {
        "NotifyAwaitingApproval": _notify("job.waiting_for_approval", "AwaitApproval"),
        **transaction(
            "AwaitApproval",
            [
                {
                    "Update": update(
                        job_key(),
                        "SET #status = :waiting, waiting_stage = :stage, last_writer = :writer, updated_at = :now",
                        names=STATUS,
                        values={
                            ":waiting": {"S": JobStatus.WAITING.value},
                            ":stage": string_at("$.stage.name"),
                            ":writer": WRITER,
                            ":now": NOW,
                        },
                    )
                },
                {"Put": token_item(keys.APPROVAL_TOKEN_SK, {"stage": string_at("$.stage.name")})},
                # The project's lock says its holder waits for a person: the jobs queued behind it
                # park without spending their queue timeout (lock.py, WaitBehindGate), and say why.
                {
                    "Update": update(
                        lock_key(),
                        f"SET {GATE} = :gate ADD wake_seq :one",
                        values={
                            ":gate": {
                                "M": {
                                    "job_id": string_at("$.job_id"),
                                    "stage": string_at("$.stage.name"),
                                    "since": NOW,
                                }
                            },
                            ":one": {"N": "1"},
                        },
                    )
                },
            ],
            comment="The job waits; POST /jobs/{id}/approve or /reject answers the token, which is kept in the job's token "
            'partition (TOKENS#, readable by no job session: docs/architecture.md, "Trust boundaries"), not on the job record '
            "that the job's agents read. The project's lock it holds says so (`gate`), and its wake_seq moves so a waiter about "
            "to park reads it first. No item has a condition, so a cancelled transaction is a conflict (or a throttle) "
            "and is retried with a new token; the approve route only ever fails this task with Relevo.Approval.Rejected.",
            waits_for_token=True,
            timeout_path="$.stage.approval_timeout_sec",
            answer_path="$.approval",
            before_catch=[
                {"ErrorEquals": ["States.Timeout"], "ResultPath": None, "Next": "ApprovalTimedOut"},
                {
                    "ErrorEquals": [ErrorClass.APPROVAL_REJECTED.value],
                    "ResultPath": "$.failure",
                    "Next": "NotifyRejected",
                },
            ],
            next_state="MarkApproved",
        ),
        **transaction(
            "MarkApproved",
            [
                {
                    "Update": update(
                        job_key(),
                        "SET #status = :running, last_writer = :writer, updated_at = :now REMOVE waiting_stage",
                        names=STATUS,
                        values={":running": {"S": JobStatus.RUNNING.value}, ":writer": WRITER, ":now": NOW},
                    )
                },
                # The stage's record, pending until its dispatch, says it was approved: its dispatch's gate condition.
                {
                    "Update": update(
                        stage_key(),
                        "SET approved_at = :now, #status = if_not_exists(#status, :pending), stage_name = :name, stage_index = :index, "
                        "last_writer = :writer, #ttl = :ttl",
                        names={**STATUS, "#ttl": "ttl"},
                        values={
                            ":now": NOW,
                            ":pending": {"S": StageStatus.PENDING.value},
                            ":name": string_at("$.stage.name"),
                            ":index": number_at("$.stage.index"),
                            ":writer": WRITER,
                            ":ttl": number_at("$.ttl"),
                        },
                    )
                },
                # Its project runs again: the jobs behind it count their queue timeout again.
                {
                    "Update": update(
                        lock_key(), f"REMOVE {GATE} ADD wake_seq :one", values={":one": {"N": "1"}}
                    )
                },
            ],
            comment="Approved: the job runs again, and the gated stage's record says so (approved_at), which lets its dispatch "
            "through; the project's lock no longer says its holder waits at a gate. No update has a condition, so a "
            "cancellation is a conflict (or a throttle) and is retried.",
            next_state=approved,
        ),
        "ApprovalTimedOut": _failure(
            ErrorClass.APPROVAL_TIMEOUT.value, "approval_timeout", "NotifyApprovalTimedOut"
        ),
        "NotifyApprovalTimedOut": _notify("job.approval_timeout", "AssembleFailureDetail"),
        "NotifyRejected": _notify("job.rejected", "AssembleFailureDetail"),
    }


# Where the dispatch takes each field of the stage message (relevo_core.models.stage_message),
# in the state a dispatch runs in: the stage's iteration item, the dispatch write's answer
# ($.dispatch) and the task's own token. A model field without a source here fails the build.
MESSAGE_SOURCES = {
    "job_id": "$.job_id",
    "stage": "$.stage.name",
    "stage_index": "$.stage.index",
    "attempt": "$.attempt",
    "task_token": "$$.Task.Token",
    "avoid_agents": "$.dispatch.avoid_agents",
    "queue_timeout_sec": "$.queue_timeout_sec",
    "requires": "$.stage.requires",
    "dispatch_key": "$.dispatch.dispatch_key",
    "project": "$.project",
    "lease_ttl_sec": "$.lease_ttl_sec",
    "signs": "$.signs",
    "shard": "$.stage.shard",
}


def message_body(shard: bool) -> dict[str, str]:
    """The stage message as the dispatch sends it, field by field from the model: a shard's, or
    a plain stage's (without the fields only a shard's message carries)."""
    unsourced = StageMessage.model_fields.keys() - MESSAGE_SOURCES.keys()
    unknown = MESSAGE_SOURCES.keys() - StageMessage.model_fields.keys()
    if unsourced or unknown:
        raise ValueError(
            f"the stage message's fields and their sources differ: without a source {sorted(unsourced)}, "
            f"not a field of StageMessage {sorted(unknown)}"
        )
    return {f"{name}.$": MESSAGE_SOURCES[name] for name in StageMessage.sent_fields(shard)}


def dispatch(gate: str, shard: bool = False) -> States:
    """Each attempt: the stage record says it is dispatched (a gated stage not yet approved, or a
    stage with shards, goes to `gate` instead), the message goes to the region's
    queue and waits for a claim (renewed while a pause holds the region), then the claimer gets
    its run token and the attempt runs. For a shard (`shard`): its own record, closed to a
    dispatch once a sibling's failure stopped it, and its index on the message."""
    states: States = {
        "MarkStageDispatched": {
            "Type": "Task",
            "Comment": "Projection: the attempt is on the region's queue, once the stage passed its approval gate (a gated stage's "
            "write is refused until it was approved: see GATE_CONDITION in tools/relevo_tools/job_machine/stage.py). `attempt` itself is written only by the claiming agent (it "
            "is the fencing token). Draws the attempt's dispatch key (States.UUID), which only its stage message carries: the claim "
            "function claims the attempt only for a caller that shows it, so an agent claims nothing it was not handed. Returns the "
            "agents that ran the stage's failed attempts, which the dispatch carries so a retry prefers another agent. ALL_NEW rather "
            "than UPDATED_NEW: moto 5.2.5 leaves an attribute out of UPDATED_NEW when its value did not change (if_not_exists), and "
            "the result selector only keeps failed_agents. The stage record carries the job's ttl, so it expires with the job.",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": {
                **update(
                    stage_key(),
                    "SET #status = :dispatched, stage_name = :name, stage_index = :index, dispatched_at = :now, dispatched_attempt = "
                    ":attempt, retry_count = :retries, cumulative_backoff_sec = :backoff, last_writer = :writer, failed_agents = "
                    "if_not_exists(failed_agents, :none), dispatch_key = :dispatch_key, #ttl = :ttl"
                    + (", shard_index = :shard" if shard else ""),
                    names={**STATUS, "#ttl": "ttl"},
                    values={
                        ":dispatched": {"S": StageStatus.DISPATCHED.value},
                        ":ttl": number_at("$.ttl"),
                        ":name": string_at("$.stage.name"),
                        ":index": number_at("$.stage.index"),
                        ":now": NOW,
                        ":attempt": number_at("$.attempt"),
                        ":retries": number_at("States.MathAdd($.attempt, -1)"),
                        ":backoff": number_at("$.backoff_total_sec"),
                        ":writer": WRITER,
                        ":none": {"L": []},
                        ":dispatch_key": string_at("States.UUID()"),
                        **({":shard": number_at("$.stage.shard")} if shard else {}),
                    },
                ),
                **(
                    {"ConditionExpression": SHARD_OPEN}
                    if shard
                    else {"ConditionExpression.$": GATE_CONDITION}
                ),
                "ReturnValues": "ALL_NEW",
            },
            "ResultSelector": {
                "avoid_agents.$": "$.Attributes.failed_agents.L[*].S",
                "dispatch_key.$": "$.Attributes.dispatch_key.S",
            },
            "ResultPath": "$.dispatch",
            "Catch": [
                {
                    "ErrorEquals": ["DynamoDB.ConditionalCheckFailedException"],
                    "ResultPath": None,
                    "Next": gate,
                }
            ],
            "Next": "DispatchStage",
        },
        "DispatchStage": {
            "Type": "Task",
            "Comment": "Waits for a claim only: queue_timeout_sec (dispatch_wait_sec) bounds the time no agent took it "
            "(Relevo.Timeout.Queue), unless a pause was in force in the region when it ran out (CheckRegionPauses): a pause never "
            "fails a job. The claiming agent answers with its id and attempt. A retry names the agents of the failed attempts "
            "(avoid_agents): they leave it to any other online agent of the region, busy or not, and run it themselves only when "
            "none is online (or after the agent's handoff_max_wait_sec safety bound). The message carries the dispatch key the claim "
            "needs, and what an agent decides before it claims (the project's workspace, the lease, whether the plan signs); the "
            "claim's answer carries the envelope itself.",
            "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
            "Parameters": {
                "QueueUrl.$": "$.queue_url",
                "MessageBody": message_body(shard),
            },
            "TimeoutSecondsPath": "$.dispatch_wait_sec",
            "ResultPath": "$.claim",
            "Catch": [
                {
                    "ErrorEquals": ["States.Timeout", "States.HeartbeatTimeout"],
                    "ResultPath": None,
                    "Next": "CheckRegionPauses",
                },
                _catch_all("EnsureCause"),
            ],
            "Next": "AwaitResult",
        },
        "CheckRegionPauses": {
            "Type": "Task",
            "Comment": "The queue wait ran out. Was any pause of the region in force (an agent's pause or drain, or the region's "
            "dispatch pause, stored until a later time than now)? Pause items keep `until` as an ISO 8601 UTC string, which compares "
            "in time order as a string. A pause keeps agents from claiming, so the wait is renewed rather than failed (issue 20: a "
            "job never fails because of a pause). A read that keeps failing ends the wait as before.",
            "Resource": "arn:aws:states:::aws-sdk:dynamodb:query",
            "Parameters": {
                "TableName": TABLE,
                "KeyConditionExpression": "pk = :pk AND begins_with(sk, :pause)",
                "FilterExpression": "#until > :now",
                "ExpressionAttributeNames": {"#until": "until"},
                "ExpressionAttributeValues": {
                    ":pk": string_at(formatted(keys.pauses_pk, "$.region")),
                    # Every pause of the region: each agent's (PAUSE#id) and the region's dispatch pause (PAUSE).
                    ":pause": {"S": keys.DISPATCH_PAUSE_SK},
                    ":now": NOW,
                },
                "Select": "COUNT",
                "ConsistentRead": True,
            },
            "ResultSelector": {"in_force.$": "$.Count"},
            "ResultPath": "$.pauses",
            "Retry": [backoff_retry(["States.ALL"], 3)],
            "Catch": [_catch_all("QueueTimedOut", None)],
            "Next": "HeldByPause",
        },
        "HeldByPause": {
            "Type": "Choice",
            "Choices": [
                {"Variable": "$.pauses.in_force", "NumericGreaterThan": 0, "Next": "RecordPauseHold"}
            ],
            "Default": "QueueTimedOut",
        },
        "RecordPauseHold": {
            "Type": "Task",
            "Comment": "The stage's queue wait is renewed while its region is paused: counted on the stage (pause_holds, "
            "last_pause_hold_at) for the job view. The same attempt is sent again with a new token; a claim of the earlier message's "
            "token is answered as no longer waiting, and that agent lets its claim go at once (relevo_agent.stage).",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": update(
                stage_key(),
                "ADD pause_holds :one SET last_pause_hold_at = :now, last_writer = :writer",
                values={":one": {"N": "1"}, ":now": NOW, ":writer": WRITER},
            ),
            "ResultPath": None,
            "Next": "WaitLongerWhilePaused",
        },
        "WaitLongerWhilePaused": {
            "Type": "Choice",
            "Comment": "While a pause holds the stage, each renewed wait lasts at least an hour (or the project's queue_timeout_sec if "
            "longer): a pause of at most 7 days then costs at most 169 renewals, about 3,700 history events (22 each), whatever a short "
            "queue_timeout_sec, well within the 25,000-event quota. A resumed agent claims the waiting message at once; the wait "
            "only bounds how long no agent does."
            + (
                " A shard's lasts an hour for each shard that may wait beside it (stage.shards.pause_hold_sec: "
                "relevo_core.execution.shard_pause_hold_sec), so the stage's shards together renew about as often as one stage "
                "(relevo_core.plan_limits: pause holds)."
                if shard
                else ""
            ),
            "Choices": [
                {
                    "Variable": "$.queue_timeout_sec",
                    "NumericGreaterThanEqualsPath": "$.stage.shards.pause_hold_sec",
                    "Next": "DispatchStage",
                }
                if shard
                else {
                    "Variable": "$.queue_timeout_sec",
                    "NumericGreaterThanEquals": PAUSE_HOLD_SEC,
                    "Next": "DispatchStage",
                }
            ],
            "Default": "PauseHoldWait",
        },
        "PauseHoldWait": (
            {
                "Type": "Pass",
                "InputPath": "$.stage.shards.pause_hold_sec",
                "ResultPath": "$.dispatch_wait_sec",
                "Next": "DispatchStage",
            }
            if shard
            else {
                "Type": "Pass",
                "Result": PAUSE_HOLD_SEC,
                "ResultPath": "$.dispatch_wait_sec",
                "Next": "DispatchStage",
            }
        ),
    }
    states |= await_result()
    return states


def await_result() -> States:
    """Hands the claimer its run token, then waits for the attempt's outcome. The token goes to the
    job's token partition (keys.run_token_sk), readable by the claim function only; the stage record
    only says that it was handed (run_handed_at), in the same transaction and only while the claim
    still holds the attempt. The agent answers through its region's outcome and heartbeat routes,
    which check that the caller holds this attempt before they use the token (relevo_core.fleet.claims)."""
    states = transaction(
        "AwaitResult",
        [
            {
                "Update": update(
                    stage_key(),
                    "SET run_handed_at = :now",
                    condition="agent_id = :agent AND attempt = :attempt",
                    values={
                        ":now": NOW,
                        ":agent": string_at("$.claim.agent_id"),
                        ":attempt": number_at("$.claim.attempt"),
                    },
                )
            },
            {
                "Put": token_item(
                    stage_token_sk(keys.RUN_TOKEN_PREFIX),
                    {"agent_id": string_at("$.claim.agent_id"), "attempt": number_at("$.claim.attempt")},
                )
            },
        ],
        comment="Hands the claimer a run token (kept in the job's token partition, which no job session reads; the stage "
        "record says run_handed_at, written only if the claim still holds the attempt), then waits. The agent renews its lease "
        "and heartbeats through its region's heartbeat route every min(lease/3, 3 s), and ends the command itself at "
        "exec_timeout_sec. A heartbeat lapse (HeartbeatSeconds = lease_ttl_sec) is a lost lease, retryable; TimeoutSeconds "
        "(exec + kill grace + lease, counted from here, on this clock) is the backstop for a live agent that never ended its "
        "command: an exec timeout. Each is caught by its own name, States.HeartbeatTimeout first: AWS scans catchers in order "
        "and States.Timeout also names a heartbeat lapse. The queue wait is over, so it never counts against the lease. The "
        "agent's outcome route answers with {stage, attempt, agent_id, status} of the fenced stage record: the Map keeps one "
        "per stage, and a stage that ended `warning` is said on the job record at its end (MarkSucceeded). A cancelled "
        "transaction is a conflict (retried with a new token) or the claim no longer holding the attempt (failed as before).",
        canceled_comment="The run token was not handed: a conflict (the agent renewing its lease at that moment) is retried; "
        "otherwise the claim no longer holds the attempt, and the attempt fails with DynamoDB's answer.",
        waits_for_token=True,
        timeout_path="$.stage.exec_backstop_sec",
        before_catch=[
            {"ErrorEquals": ["States.HeartbeatTimeout"], "ResultPath": None, "Next": "LeaseExpired"},
            {"ErrorEquals": ["States.Timeout"], "ResultPath": None, "Next": "ExecTimedOut"},
            {
                "ErrorEquals": [ErrorClass.MANUAL_REVIEW.value],
                "ResultPath": "$.failure",
                "Next": "AwaitManualReview",
            },
        ],
        after_catch=[_catch_all("EnsureCause")],
        answer_path="$.result",
        output_path="$.result",
        heartbeat_path="$.lease_ttl_sec",
        kept_conflicting="RunTokenRefused",
        refused="RunTokenRefused",
        next_state=None,
    )
    states["RunTokenRefused"] = {
        "Type": "Pass",
        "Parameters": {"Error.$": "$.conflict.error.Error", "Cause.$": "$.conflict.error.Cause"},
        "ResultPath": "$.failure",
        "Next": "EnsureCause",
    }
    return states


def manual_review(retry: str, shard: bool = False) -> States:
    """Reconciliation found an effect it cannot tie to this operation: an operator resolves the
    stage as succeeded, retry (on to `retry`) or failed. A shard resolved as succeeded writes its
    own record only: the job's last successful stage is the fan-out's to write, once the stage as
    a whole succeeded (shards.py, RecordShardsSucceeded)."""
    states: States = {
        **transaction(
            "AwaitManualReview",
            [
                {
                    "Update": update(
                        stage_key(),
                        "SET #status = :review, review_attempt = :attempt, last_writer = :writer",
                        names=STATUS,
                        values={
                            ":review": {"S": StageStatus.MANUAL_REVIEW.value},
                            ":attempt": number_at("$.attempt"),
                            ":writer": WRITER,
                        },
                    )
                },
                {
                    "Put": token_item(
                        stage_token_sk(keys.REVIEW_TOKEN_PREFIX), {"attempt": number_at("$.attempt")}
                    )
                },
            ],
            comment="Reconciliation found an effect it cannot tie to this operation: nothing is overwritten, and the stage waits "
            "for an operator without a timeout of its own (the execution's limit bounds it). POST /jobs/{id}/stages/{stage}/resolve "
            "answers the token, kept in the job's token partition (which no job session reads): succeeded, retry (a new attempt of "
            "the same operation) or failed. Neither item has a condition, so a cancelled transaction is a conflict, retried.",
            waits_for_token=True,
            answer_path="$.review",
            after_catch=[_catch_all("EnsureCause")],
            next_state="ResolvedAs",
        ),
        "ResolvedAs": {
            "Type": "Choice",
            "Comment": "An operator's resolution: succeeded ends the stage; retry dispatches the next attempt at once (it runs, it "
            "is not reconciled again); failed arrives as a task failure instead.",
            "Choices": [
                {
                    "Variable": "$.review.resolution",
                    "StringEquals": "succeeded",
                    "Next": "RecordResolvedSucceeded",
                },
                {"Variable": "$.review.resolution", "StringEquals": "retry", "Next": "ResolvedRetry"},
            ],
            "Default": "UnknownResolution",
        },
        "UnknownResolution": _failure(
            ErrorClass.RESOLVED_FAILED.value, "the resolution was neither succeeded, retry nor failed"
        ),
        "ResolvedRetry": {
            "Type": "Pass",
            "Parameters": {"delay_sec": 0},
            "ResultPath": "$.backoff",
            "Next": retry,
        },
    }
    resolved = update(
        stage_key(),
        "SET #status = :succeeded, ended_at = :now, last_writer = :writer",
        names=STATUS,
        values={":succeeded": {"S": StageStatus.SUCCEEDED.value}, ":now": NOW, ":writer": WRITER},
    )
    if shard:
        states["RecordResolvedSucceeded"] = {
            "Type": "Task",
            "Comment": "Resolved as succeeded: the shard's record only. Its output is the claim, as a stage's (the fan-out "
            "keeps each shard's output).",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": resolved,
            "ResultPath": None,
            "OutputPath": "$.claim",
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
            "End": True,
        }
        return states
    states |= transaction(
        "RecordResolvedSucceeded",
        [
            {"Update": resolved},
            {
                "Update": update(
                    job_key(),
                    "SET last_successful_stage = :stage, last_writer = :writer, updated_at = :now",
                    values={":stage": string_at("$.stage.name"), ":now": NOW, ":writer": WRITER},
                )
            },
        ],
        comment="Resolved as succeeded: the stage and the job's last successful stage, in one transaction. Neither update has a "
        "condition, so a cancellation is a conflict (or a throttle) and is retried.",
        output_path="$.claim",
        next_state=None,
    )
    return states


def attempt_failure(retry: str) -> States:
    """A failed attempt is recorded; a retryable class with attempts left waits its backoff and
    goes on to `retry`; anything else fails the stage (StageFailed)."""
    states: States = {name: _failure(error.value, cause) for name, (error, cause) in FAILURE_NAMES.items()}
    states |= {
        "EnsureCause": {
            "Type": "Choice",
            "Comment": "A reported failure may come without a cause; the record and the DLQ always carry one.",
            "Choices": [{"Variable": "$.failure.Cause", "IsString": True, "Next": "RecordAttemptFailure"}],
            "Default": "AddCause",
        },
        "AddCause": {
            "Type": "Pass",
            "Parameters": {"Error.$": "$.failure.Error", "Cause": "no cause was reported"},
            "ResultPath": "$.failure",
            "Next": "RecordAttemptFailure",
        },
        "RecordAttemptFailure": {
            "Type": "Task",
            "Comment": "Every failed attempt is kept on the stage: attempt, agent (empty when no agent claimed it), error class, "
            "cause; the agent also joins failed_agents, which the next dispatch avoids.",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": update(
                stage_key(),
                "SET last_error = :error, attempts_log = list_append(if_not_exists(attempts_log, :none), :this), failed_agents = "
                "list_append(if_not_exists(failed_agents, :none), :agent), last_writer = :writer",
                values={
                    ":error": string_at("$.failure.Error"),
                    ":none": {"L": []},
                    ":this": {
                        "L": [
                            {
                                "M": {
                                    "attempt": number_at("$.attempt"),
                                    "agent": string_at("$.claim.agent_id"),
                                    "error": string_at("$.failure.Error"),
                                    "cause": string_at("$.failure.Cause"),
                                    "at": NOW,
                                }
                            }
                        ]
                    },
                    ":writer": WRITER,
                    ":agent": {"L": [string_at("$.claim.agent_id")]},
                },
            ),
            "ResultPath": None,
            "Next": "CheckKeyFrozen",
        },
        "CheckKeyFrozen": {
            "Type": "Task",
            "Comment": "DLQ freeze: while the job's idempotency key is frozen (it kept dead-lettering), a failed attempt is not "
            "retried.",
            "Resource": "arn:aws:states:::dynamodb:getItem",
            "Parameters": {
                "TableName": TABLE,
                "Key": {
                    "pk": string_at(formatted(keys.freeze_pk, "$.idempotency_key")),
                    "sk": {"S": keys.FREEZE_SK},
                },
                "ConsistentRead": True,
                "ProjectionExpression": "frozen_at",
            },
            "ResultPath": "$.freeze",
            "Next": "ShouldRetry",
        },
        "ShouldRetry": {
            "Type": "Choice",
            "Comment": "Retryable classes only, each up to the frozen plan's attempts for it; none while the job's idempotency key "
            "is frozen.",
            "Choices": [
                {"Variable": "$.freeze.Item.frozen_at", "IsPresent": True, "Next": "AssembleFailureDetail"},
                *(
                    {
                        "And": [
                            {"Variable": "$.failure.Error", "StringEquals": error.value},
                            {"Variable": "$.attempt", "NumericLessThanPath": f"$.stage.attempts.{key}"},
                        ],
                        "Next": "ComputeBackoff",
                    }
                    for error, key in RETRY_KEYS.items()
                ),
            ],
            "Default": "AssembleFailureDetail",
        },
        "ComputeBackoff": {
            "Type": "Pass",
            "Comment": "Exponential backoff with full jitter: a random delay below min(max_delay, base * 2^(attempt-1)).",
            "Parameters": {
                "delay_sec.$": "States.MathRandom(0, States.ArrayGetItem($.stage.backoff_caps_sec, $.attempt))"
            },
            "ResultPath": "$.backoff",
            "Next": "BackoffWait",
        },
        "BackoffWait": {"Type": "Wait", "SecondsPath": "$.backoff.delay_sec", "Next": "NextAttempt"},
        "NextAttempt": {
            "Type": "Pass",
            "Parameters": {
                "job_id.$": "$.job_id",
                "project.$": "$.project",
                "signs.$": "$.signs",
                "queue_url.$": "$.queue_url",
                "lease_ttl_sec.$": "$.lease_ttl_sec",
                "queue_timeout_sec.$": "$.queue_timeout_sec",
                "dispatch_wait_sec.$": "$.queue_timeout_sec",
                "region.$": "$.region",
                "stage.$": "$.stage",
                "attempt.$": "States.MathAdd($.attempt, 1)",
                "backoff_total_sec.$": "States.MathAdd($.backoff_total_sec, $.backoff.delay_sec)",
                "claim": {"agent_id": ""},
                "idempotency_key.$": "$.idempotency_key",
                "ttl.$": "$.ttl",
            },
            "Next": retry,
        },
    }
    return states


def stage_failure(shard: bool = False) -> States:
    """The stage fails the job: its record is closed, the job's last successful stage set, and
    the Map fails with the stage's failure detail. A shard (`shard`) closes its own record and
    names itself in the detail; with fail_fast its failure fails the fan-out at once (which
    stops its siblings: shards.py), without it the shard ends with its failure as its output and
    the siblings run on."""
    states: States = {
        "AssembleFailureDetail": {
            "Type": "Pass",
            "Parameters": {
                "stage.$": "$.stage.name",
                "stage_index.$": "$.stage.index",
                **({"shard.$": "$.stage.shard"} if shard else {}),
                "error_class.$": "$.failure.Error",
                "cause.$": "$.failure.Cause",
                "attempts.$": "$.attempt",
                "retry_count.$": "States.MathAdd($.attempt, -1)",
                "cumulative_backoff_sec.$": "$.backoff_total_sec",
            },
            "ResultPath": "$.detail",
            "Next": "MarkStageFailed",
        },
        "MarkStageFailed": {
            "Type": "Task",
            "Comment": "The stage this job fails on ends `failed` (a timeout leaves no agent to write it), closed to any later claim "
            "(a message still in the queue after a queue timeout), and leaves the held-by index, so no stage of an ended job stays "
            "running. The gate of a rejected job was never dispatched: no record, nothing to write.",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": update(
                stage_key(),
                "SET #status = :failed, ended_at = if_not_exists(ended_at, :now), closed_at = :now, last_writer = :writer REMOVE held_by",
                condition="attribute_exists(pk)",
                names=STATUS,
                values={":failed": {"S": StageStatus.FAILED.value}, ":now": NOW, ":writer": WRITER},
            ),
            "ResultPath": None,
            "Catch": [
                {
                    "ErrorEquals": ["DynamoDB.ConditionalCheckFailedException"],
                    "ResultPath": None,
                    "Next": "RecordLastSuccess",
                }
            ],
            "Next": "RecordLastSuccess",
        },
        "RecordLastSuccess": {
            "Type": "Task",
            "Comment": "The job's last successful stage, should it end on this failure: the stage before this one, or for the first "
            "that runs, the one the job stands on (a rerun from a later stage); DynamoDB NULL when none. The execution input carries "
            "it as an attribute value, so one write covers both. Written by the state machine only: agents cannot write the job "
            "record (store/keys.stages_pk). Best effort: the job view reads it off the stage records anyway.",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": update(
                job_key(),
                "SET last_successful_stage = :last, last_writer = :writer",
                values={":last.$": "$.stage.previous_success", ":writer": WRITER},
            ),
            "ResultPath": None,
            "Catch": [_catch_all("DescribeStageFailure", None)],
            "Next": "DescribeStageFailure",
        },
        "DescribeStageFailure": {
            "Type": "Pass",
            "Comment": "The job's failure names its stage, class, attempts and backoff: the DLQ entry is enough to resume.",
            "Parameters": {"Error.$": "$.failure.Error", "Cause.$": "States.JsonToString($.detail)"},
            "ResultPath": "$.failure",
            "Next": "StageFailed",
        },
        "StageFailed": {"Type": "Fail", "ErrorPath": "$.failure.Error", "CausePath": "$.failure.Cause"},
    }
    if shard:
        # The job's last successful stage is the fan-out's to write (shards.py), once.
        del states["RecordLastSuccess"]
        states["MarkStageFailed"]["Next"] = "DescribeStageFailure"
        states["MarkStageFailed"]["Catch"][0]["Next"] = "DescribeStageFailure"
        states["DescribeStageFailure"]["Next"] = "StopsSiblings"
        states["StopsSiblings"] = {
            "Type": "Choice",
            "Comment": "fail_fast: the shard's failure fails the fan-out now. Otherwise its failure is its output, and the "
            "fan-out fails the stage once every shard ended.",
            "Choices": [
                {"Variable": "$.stage.shards.fail_fast", "BooleanEquals": True, "Next": "StageFailed"}
            ],
            "Default": "ShardFailedAlone",
        }
        # Its output is small, whatever its cause: its index and its error class. Up to 45 shards'
        # outputs meet in the fan-out's state, which Step Functions bounds (256 KiB); the shard's
        # failure, cause and all, is on its own record (RecordAttemptFailure: last_error, attempts_log).
        states["ShardFailedAlone"] = {
            "Type": "Pass",
            "Parameters": {"failed.$": "$.stage.shard", "error.$": "$.failure.Error"},
            "End": True,
        }
    return states


def stage_states(shard: bool = False) -> tuple[str, States]:
    """Every state of one stage, and the one it starts at. The stage's input is one item of
    run_stages' ItemSelector; its output, the agent's answer. A shard's (`shard`): one item of
    the fan-out's (shards.py), without the approval gate (the stage passed it before its fan-out)."""
    states: States = {}
    if shard:
        states |= dispatch(gate="ClosedBeforeDispatch", shard=True)
        states["ClosedBeforeDispatch"] = {
            "Type": "Pass",
            "Comment": "The shard's record was closed before its dispatch: a sibling's failure stopped it, or a redrive carried it "
            "over as succeeded from the job it resumes (relevo_core.store.carried_shards). Its output says so, small: the "
            "fan-out keeps every shard's.",
            "Parameters": {"shard.$": "$.stage.shard", "dispatched": False},
            "End": True,
        }
    else:
        states |= dispatch(gate="GatedOrSharded")
        states |= approval_gate("MarkStageDispatched")
        states |= fan_out("NotifyAwaitingApproval", *stage_states(shard=True))
    states |= manual_review("NextAttempt", shard)
    states |= attempt_failure("MarkStageDispatched")
    states |= stage_failure(shard)
    return "MarkStageDispatched", states


def run_stages(next_state: str, on_failure: str) -> State:
    """The stages of the plan, strictly in order, each from stage_states()."""
    start, states = stage_states()
    return {
        "Type": "Map",
        "Comment": "Stages run strictly in plan order. Each iteration's output is what its agent answered (a resolved manual "
        "review: its claim), kept as $.stage_outcomes for the job's end.",
        "ItemsPath": "$.stages",
        "MaxConcurrency": 1,
        "ItemSelector": {
            "job_id.$": "$.job_id",
            "queue_url.$": "$.queue_url",
            "lease_ttl_sec.$": "$.lease_ttl_sec",
            "queue_timeout_sec.$": "$.queue_timeout_sec",
            "dispatch_wait_sec.$": "$.queue_timeout_sec",
            "region.$": "$.envelope.region_affinity",
            "stage.$": "$$.Map.Item.Value",
            "attempt": 1,
            "backoff_total_sec": 0,
            "project.$": "$.project",
            "signs.$": "$.signs",
            "claim": {"agent_id": ""},
            "idempotency_key.$": "$.envelope.idempotency_key",
            "ttl.$": "$.envelope.ttl",
        },
        "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": start, "States": states},
        "ResultPath": "$.stage_outcomes",
        "Next": next_state,
        "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": on_failure}],
    }
