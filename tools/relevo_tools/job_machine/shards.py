"""A stage with shards (`parallel`, `matrix`): a Map over its shards around the same per-stage
states, each shard a stage attempt of its own (its own record, dispatch key, claim, lease and
retries by error class), then the stage's end.

The stage's own dispatch write is refused (stage.FANS_OUT), which leads here, so a stage
without shards pays no transition for the fan-out. Fail-fast: the first shard to fail for good
fails the Map. Step Functions then stops the other iterations, but a stopped iteration leaves its
agent running, and moto's interpreter (5.2.5) does not stop them at all: it starts no new one,
and those already running go on in the background. So the stop is Relevo's own: StopShards
marks every shard record that has not ended `canceled` and closed, which the running agents'
fenced lease renewal sees (relevo_core.store.stage_attempts: HOLDS_ATTEMPT wants running or
reconciled), so they kill their process groups; a shard not yet dispatched is refused its
dispatch (stage.SHARD_OPEN).
"""

from __future__ import annotations

from typing import Any

from relevo_core.models.status import StageStatus
from relevo_tools.job_machine.asl import (
    NOW,
    STATUS,
    WRITER,
    State,
    States,
    job_key,
    number_at,
    stage_key,
    string_at,
    transaction,
    update,
)

SHARD_PREFIX = "Shard"
# What a shard's iteration is given: the stage's fields, with the shard's own record key and index
# (relevo_core.execution._fan_out) merged over them.
STAGE_AS_SHARD = "States.JsonMerge($.stage, $$.Map.Item.Value, false)"
ENDED_SHARD = [
    StageStatus.SUCCEEDED,
    StageStatus.WARNING,
    StageStatus.FAILED,
    StageStatus.CANCELED,
    StageStatus.SKIPPED,
]
# Where a stage that failed without fail_fast keeps each failed shard's failure (its summary says).
SHARD_FAILURES_WHERE = (
    "each failed shard's error class, attempts, backoff and cause are on its own record (STAGE#nn#SHARD#kk: "
    "last_error, attempts_log): relevo dlq view and relevo job view list them"
)


def renamed(states: States, prefix: str) -> States:
    """`states` with `prefix` before every name and every reference to one: a shard's states live
    inside the stage's iteration, beside the stage's own, and a name says which it is."""
    names = set(states)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                key: (prefix + item if key in ("Next", "Default") and item in names else walk(item))
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    return {prefix + name: walk(state) for name, state in states.items()}


def _iteration_input(stage: str) -> dict[str, Any]:
    """The item a shard's iteration starts from: what the stage's iteration was given, the stage
    as `stage`, a first attempt."""
    return {
        "job_id.$": "$.job_id",
        "queue_url.$": "$.queue_url",
        "lease_ttl_sec.$": "$.lease_ttl_sec",
        "queue_timeout_sec.$": "$.queue_timeout_sec",
        "dispatch_wait_sec.$": "$.queue_timeout_sec",
        "region.$": "$.region",
        "stage.$": stage,
        "attempt": 1,
        "backoff_total_sec": 0,
        "project.$": "$.project",
        "signs.$": "$.signs",
        "claim": {"agent_id": ""},
        "idempotency_key.$": "$.idempotency_key",
        "ttl.$": "$.ttl",
    }


def _stage_record(expression: str, values: dict[str, Any], condition: str | None = None) -> dict[str, Any]:
    return update(
        stage_key(),
        expression,
        condition=condition,
        names={**STATUS, "#ttl": "ttl"} if "#ttl" in expression else STATUS,
        values=values,
    )


def fan_out(on_gate: str, shard_start: str, shard_states: States) -> States:
    """The states of a stage with shards inside the stage's iteration: the stage's record says it
    runs (through its approval gate: `on_gate`), its shards run in a Map, then the stage
    succeeds, or its running shards are stopped and it fails with what the failed ones left."""
    stop_item: State = {
        "Type": "Task",
        "Comment": "Stops the shard unless it ended: canceled and closed, so its agent's next fenced lease "
        "renewal is "
        "refused and it kills the command's process group, and a dispatch still to come is refused "
        "(SHARD_OPEN).",
        "Resource": "arn:aws:states:::dynamodb:updateItem",
        "Parameters": update(
            stage_key(),
            "SET #status = :canceled, ended_at = :now, closed_at = :now, last_writer = :writer, #ttl = :ttl "
            "REMOVE held_by",
            condition="attribute_not_exists(#status) OR NOT #status IN ("
            + ", ".join(f":{status.value}" for status in ENDED_SHARD)
            + ")",
            names={**STATUS, "#ttl": "ttl"},
            values={
                ":canceled": {"S": StageStatus.CANCELED.value},
                ":now": NOW,
                ":writer": WRITER,
                ":ttl": number_at("$.ttl"),
                **{f":{status.value}": {"S": status.value} for status in ENDED_SHARD},
            },
        ),
        "ResultPath": None,
        "Catch": [
            {
                "ErrorEquals": ["DynamoDB.ConditionalCheckFailedException"],
                "ResultPath": None,
                "Next": "ShardHadEnded",
            }
        ],
        "End": True,
    }
    return {
        "GatedOrSharded": {
            "Type": "Choice",
            "Comment": "The stage's dispatch was refused: it has shards (gate 2 or 3), or it waits for its "
            "approval.",
            "Choices": [{"Variable": "$.stage.gate", "NumericGreaterThanEquals": 2, "Next": "StartShards"}],
            "Default": on_gate,
        },
        "StartShards": {
            "Type": "Task",
            "Comment": "The stage's own record says its shards run, once its approval gate let it through "
            "(gate 3: approved_at "
            "must be there, as for a stage without shards). Each shard writes its own record.",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": {
                **_stage_record(
                    "SET #status = :running, stage_name = :name, stage_index = :index, shard_count = "
                    ":count, dispatched_at = :now, "
                    "last_writer = :writer, #ttl = :ttl",
                    {
                        ":running": {"S": StageStatus.RUNNING.value},
                        ":name": string_at("$.stage.name"),
                        ":index": number_at("$.stage.index"),
                        ":count": number_at("$.stage.shards.count"),
                        ":now": NOW,
                        ":writer": WRITER,
                        ":ttl": number_at("$.ttl"),
                    },
                ),
                "ConditionExpression.$": (
                    "States.ArrayGetItem(States.Array('attribute_not_exists(approved_at)', "
                    "'attribute_exists(approved_at)', 'attribute_not_exists(approved_at)', "
                    "'attribute_exists(approved_at)'), $.stage.gate)"
                ),
            },
            "ResultPath": None,
            "Catch": [
                {
                    "ErrorEquals": ["DynamoDB.ConditionalCheckFailedException"],
                    "ResultPath": None,
                    "Next": on_gate,
                }
            ],
            "Next": "RunShards",
        },
        "RunShards": {
            "Type": "Map",
            "Comment": "Every shard of the stage, at most max_parallel at once (0: all; an inline Map runs "
            "at most 40 at once, "
            "and relevo_core.plan_limits refuses a stage that would ask more), each through the per-stage "
            "states. With "
            "fail_fast a shard's failure fails the Map (Catch: StopShards); without, a failed shard's "
            "output is {failed: its index, error}.",
            "ItemsPath": "$.stage.shards.items",
            "MaxConcurrencyPath": "$.stage.shards.max_parallel",
            "ItemSelector": _iteration_input(STAGE_AS_SHARD),
            "ItemProcessor": {
                "ProcessorConfig": {"Mode": "INLINE"},
                "StartAt": SHARD_PREFIX + shard_start,
                "States": renamed(shard_states, SHARD_PREFIX),
            },
            # Each failed shard's index and its error (ShardFailedAlone), in shard order: $[*].failed
            # and $[*].error are lists on AWS and in moto 5.2.5 alike, and an intrinsic reads them the
            # same on both (a member of an array item, failed[0].Error, reads as a one-item list in
            # moto's JSONPath). Its cause stays on its own record: see ShardsFailed.
            # Whether a shard ended `warning` (its agent's answer says so), and every shard's output in
            # shard order, for the stage's outcome; `status` is the stage's unless ShardsWarned says
            # otherwise ("Intrinsic functions": States.ArrayContains).
            "ResultSelector": {
                "failed.$": "$[*].failed",
                "errors.$": "$[*].error",
                "warned.$": f"States.ArrayContains($[*].status, '{StageStatus.WARNING.value}')",
                "status": StageStatus.SUCCEEDED.value,
                "outcomes.$": "$",
            },
            "ResultPath": "$.shard_results",
            "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.failure", "Next": "StopShards"}],
            "Next": "AnyShardFailed",
        },
        "AnyShardFailed": {
            "Type": "Choice",
            "Choices": [
                {
                    "Variable": "$.shard_results.failed[0]",
                    "IsPresent": True,
                    "Next": "SummarizeShardFailures",
                },
                {"Variable": "$.shard_results.warned", "BooleanEquals": True, "Next": "ShardsWarned"},
            ],
            "Default": "RecordShardsSucceeded",
        },
        "ShardsWarned": {
            "Type": "Pass",
            "Comment": "Every shard succeeded, some with warnings: the stage ends `warning`, as a stage "
            "without shards whose "
            "agent said so (the job view and the commit status read it).",
            "Result": StageStatus.WARNING.value,
            "ResultPath": "$.shard_results.status",
            "Next": "RecordShardsSucceeded",
        },
        "SummarizeShardFailures": {
            "Type": "Pass",
            "Comment": "fail_fast false: every shard ended and some failed. The stage's failure is a "
            "summary of a bounded size "
            "whatever the shards' causes: its failed shards (45 at most), the first one's error class, and "
            "where each failed "
            "shard's own failure is (its record: last_error, attempts_log), which the dead-letter view and "
            "the job view read. "
            "A failure listing every shard's cause would pass Step Functions' quotas: a cause of 32,768 "
            "characters at most, a "
            "state of 256 KiB (States.DataLimitExceeded, which no Catch takes; relevo_core.plan_limits).",
            "Parameters": {
                "stage.$": "$.stage.name",
                "stage_index.$": "$.stage.index",
                "shards.$": "$.stage.shards.count",
                "failed_count.$": "States.ArrayLength($.shard_results.failed)",
                "failed_shards.$": "$.shard_results.failed",
                "first_failed_shard.$": "States.ArrayGetItem($.shard_results.failed, 0)",
                "error_class.$": "States.ArrayGetItem($.shard_results.errors, 0)",
                "reason.$": "States.Format('{} of {} shards failed, the first (shard {}) with {}', "
                "States.ArrayLength($.shard_results.failed), $.stage.shards.count, "
                "States.ArrayGetItem($.shard_results.failed, 0), "
                "States.ArrayGetItem($.shard_results.errors, 0))",
                "shard_failures": SHARD_FAILURES_WHERE,
            },
            "ResultPath": "$.failure_summary",
            "Next": "ShardsFailed",
        },
        "ShardsFailed": {
            "Type": "Pass",
            "Comment": "The stage fails with the first failed shard's error and the summary as its cause.",
            "Parameters": {
                "Error.$": "$.failure_summary.error_class",
                "Cause.$": "States.JsonToString($.failure_summary)",
            },
            "ResultPath": "$.failure",
            "Next": "StopShards",
        },
        **transaction(
            "RecordShardsSucceeded",
            [
                {
                    "Update": update(
                        stage_key(),
                        "SET #status = :ended, ended_at = :now, last_writer = :writer",
                        names=STATUS,
                        values={
                            ":ended": string_at("$.shard_results.status"),
                            ":now": NOW,
                            ":writer": WRITER,
                        },
                    )
                },
                {
                    "Update": update(
                        job_key(),
                        "SET last_successful_stage = :stage, last_writer = :writer, updated_at = :now",
                        values={":stage": string_at("$.stage.name"), ":now": NOW, ":writer": WRITER},
                    )
                },
            ],
            comment="Every shard succeeded (some perhaps with warnings): the stage's record and the job's "
            "last successful stage, "
            "written here once the stage as a whole succeeded, in one transaction. Neither "
            "update has a condition, so a cancellation is a conflict (or a throttle) and is retried.",
            next_state="ShardsSucceeded",
        ),
        "ShardsSucceeded": {
            "Type": "Pass",
            "Comment": "The stage's outcome, as the job's end reads it (stage_outcomes): its name, its "
            "status (`warning` when a "
            "shard's was), its shard count and each shard's output in shard order (its agent's answer).",
            "Parameters": {
                "stage.$": "$.stage.name",
                "status.$": "$.shard_results.status",
                "shards.$": "$.stage.shards.count",
                "shard_outcomes.$": "$.shard_results.outcomes",
            },
            "End": True,
        },
        "StopShards": {
            "Type": "Map",
            "Comment": "The stage failed: every shard that has not ended is stopped (see StopShard), all at "
            "once.",
            "ItemsPath": "$.stage.shards.items",
            "ItemSelector": {"job_id.$": "$.job_id", "ttl.$": "$.ttl", "stage.$": "$$.Map.Item.Value"},
            "ItemProcessor": {
                "ProcessorConfig": {"Mode": "INLINE"},
                "StartAt": "StopShard",
                "States": {"StopShard": stop_item, "ShardHadEnded": {"Type": "Succeed"}},
            },
            "ResultPath": None,
            "Next": "MarkShardedStageFailed",
        },
        "MarkShardedStageFailed": {
            "Type": "Task",
            "Comment": "The stage's own record ends failed and closed, with the failure that ended it "
            "(which names its shards).",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": _stage_record(
                "SET #status = :failed, ended_at = :now, closed_at = :now, last_error = :error, "
                "failed_shards = :cause, "
                "last_writer = :writer",
                {
                    ":failed": {"S": StageStatus.FAILED.value},
                    ":now": NOW,
                    ":error": string_at("$.failure.Error"),
                    ":cause": string_at("$.failure.Cause"),
                    ":writer": WRITER,
                },
            ),
            "ResultPath": None,
            "Next": "RecordLastSuccessBeforeShards",
        },
        "RecordLastSuccessBeforeShards": {
            "Type": "Task",
            "Comment": "As RecordLastSuccess for a stage without shards: the job's last successful stage, "
            "should it end here.",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": update(
                job_key(),
                "SET last_successful_stage = :last, last_writer = :writer",
                values={":last.$": "$.stage.previous_success", ":writer": WRITER},
            ),
            "ResultPath": None,
            "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "ShardedStageFailed"}],
            "Next": "ShardedStageFailed",
        },
        "ShardedStageFailed": {
            "Type": "Fail",
            "ErrorPath": "$.failure.Error",
            "CausePath": "$.failure.Cause",
        },
    }
