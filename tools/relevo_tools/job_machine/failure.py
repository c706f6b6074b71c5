"""What follows an attempt that did not succeed: the operator's manual review of an effect that
reconciliation could not tie to it, the failed attempt's record and its retry by error class
(with backoff), and the stage's failure, which fails the job (or, for a shard, the fan-out)."""

from __future__ import annotations

from relevo_core.execution import RETRY_KEYS
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store import keys
from relevo_tools.job_machine.asl import (
    NOW,
    STATUS,
    TABLE,
    WRITER,
    State,
    States,
    backoff_retry,
    catch_all,
    formatted,
    job_key,
    number_at,
    stage_key,
    stage_token_sk,
    string_at,
    token_item,
    transaction,
    update,
)

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


def failed_with(error: str, cause: str, next_state: str = "RecordAttemptFailure") -> State:
    return {
        "Type": "Pass",
        "Result": {"Error": error, "Cause": cause},
        "ResultPath": "$.failure",
        "Next": next_state,
    }


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
            comment="Reconciliation found an effect it cannot tie to this operation: nothing is "
            "overwritten, and the stage waits "
            "for an operator without a timeout of its own (the execution's limit bounds it). POST "
            "/jobs/{id}/stages/{stage}/resolve "
            "answers the token, kept in the job's token partition (which no job session reads): succeeded, "
            "retry (a new attempt of "
            "the same operation) or failed. Neither item has a condition, so a cancelled transaction is a "
            "conflict, retried.",
            waits_for_token=True,
            answer_path="$.review",
            after_catch=[catch_all("EnsureCause")],
            next_state="ResolvedAs",
        ),
        "ResolvedAs": {
            "Type": "Choice",
            "Comment": "An operator's resolution: succeeded ends the stage; retry dispatches the next "
            "attempt at once (it runs, it "
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
        "UnknownResolution": failed_with(
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
            "Comment": "Resolved as succeeded: the shard's record only. Its output is the claim, as a "
            "stage's (the fan-out "
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
        comment="Resolved as succeeded: the stage and the job's last successful stage, in one transaction. "
        "Neither update has a "
        "condition, so a cancellation is a conflict (or a throttle) and is retried.",
        output_path="$.claim",
        next_state=None,
    )
    return states


def attempt_failure(retry: str) -> States:
    """A failed attempt is recorded; a retryable class with attempts left waits its backoff and
    goes on to `retry`; anything else fails the stage (StageFailed)."""
    states: States = {name: failed_with(error.value, cause) for name, (error, cause) in FAILURE_NAMES.items()}
    states |= {
        "EnsureCause": {
            "Type": "Choice",
            "Comment": "A reported failure may come without a cause; the record and the DLQ always carry "
            "one.",
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
            "Comment": "Every failed attempt is kept on the stage: attempt, agent (empty when no agent "
            "claimed it), error class, "
            "cause; the agent also joins failed_agents, which the next dispatch avoids.",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": update(
                stage_key(),
                "SET last_error = :error, attempts_log = list_append(if_not_exists(attempts_log, :none), "
                ":this), failed_agents = "
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
            "Comment": "DLQ freeze: while the job's idempotency key is frozen (it kept dead-lettering), a "
            "failed attempt is not "
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
            "Comment": "Retryable classes only, each up to the frozen plan's attempts for it; none while "
            "the job's idempotency key "
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
            "Comment": "Exponential backoff with full jitter: a random delay below min(max_delay, base * "
            "2^(attempt-1)).",
            "Parameters": {
                "delay_sec.$": "States.MathRandom(0, States.ArrayGetItem($.stage.backoff_caps_sec, "
                "$.attempt))"
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
            "Comment": "The stage this job fails on ends `failed` (a timeout leaves no agent to write it), "
            "closed to any later claim "
            "(a message still in the queue after a queue timeout), and leaves the held-by index, so no "
            "stage of an ended job stays "
            "running. The gate of a rejected job was never dispatched: no record, nothing to write.",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": update(
                stage_key(),
                "SET #status = :failed, ended_at = if_not_exists(ended_at, :now), closed_at = :now, "
                "last_writer = :writer REMOVE held_by",
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
            "Comment": "The job's last successful stage, should it end on this failure: the stage before "
            "this one, or for the first "
            "that runs, the one the job stands on (a rerun from a later stage); DynamoDB NULL when none. "
            "The execution input carries "
            "it as an attribute value, so one write covers both. Written by the state machine only: agents "
            "cannot write the job "
            "record (store/keys.stages_pk). Best effort: the job view reads it off the stage records anyway.",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": update(
                job_key(),
                "SET last_successful_stage = :last, last_writer = :writer",
                values={":last.$": "$.stage.previous_success", ":writer": WRITER},
            ),
            "ResultPath": None,
            "Catch": [catch_all("DescribeStageFailure", None)],
            "Next": "DescribeStageFailure",
        },
        "DescribeStageFailure": {
            "Type": "Pass",
            "Comment": "The job's failure names its stage, class, attempts and backoff: the DLQ entry is "
            "enough to resume.",
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
            "Comment": "fail_fast: the shard's failure fails the fan-out now. Otherwise its failure is its "
            "output, and the "
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
