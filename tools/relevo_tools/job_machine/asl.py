"""The pieces job.asl.json is made of: DynamoDB keys and attribute values as the state machine
spells them, and the one helper that writes a DynamoDB transaction with its conflict retry.

JSONPath throughout, not JSONata or workflow variables: moto 5.2.5's interpreter parses both but
evaluates neither (its JSONata bridge is a stub, and a variable is read through it), so a machine
using them would not run in the emulator that tests it (see docs/architecture.md, "The job state
machine, generated").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relevo_core.store import keys

State = dict[str, Any]
States = dict[str, State]

TABLE = "${TableName}"
EXECUTION_NAME = "$$.Execution.Name"
# Who wrote a record last, and when: the execution (its name is the job id) and the time the
# writing state was entered.
WRITER = {"S.$": "States.Format('state_machine:{}', $$.Execution.Name)"}
NOW = {"S.$": "$$.State.EnteredTime"}
# The attribute named `status` (a DynamoDB reserved word).
STATUS = {"#status": "status"}
# A string set of this execution's name (lock holders, waiters).
ME = {"SS.$": "States.Array($$.Execution.Name)"}

TRANSACT_WRITE = "arn:aws:states:::aws-sdk:dynamodb:transactWriteItems"
TRANSACT_WRITE_WAITING = "arn:aws:states:::aws-sdk:dynamodb:transactWriteItems.waitForTaskToken"
# The error the aws-sdk integration raises for a cancelled transaction ("Handling errors in
# Step Functions workflows": aws-sdk errors are ServiceName.ExceptionName, the service name as the
# SDK spells it).
TRANSACTION_CANCELED = "DynamoDb.TransactionCanceledException"
INTERNAL_ERROR = "DynamoDb.InternalServerErrorException"
# A cancellation's reasons are listed in the message Step Functions passes on as the Cause.
CONFLICT_REASONS = ("TransactionConflict", "ThrottlingError")
CONFLICT_RETRIES = 5
KEPT_CONFLICTING = "TransactionKeptConflicting"


def formatted(key_format: Callable[[str], str], path: str) -> str:
    """A key as relevo_core.store.keys spells it (`key_format`, e.g. keys.job_pk), filled in from `path`."""
    return f"States.Format('{key_format('{}')}', {path})"


def string_at(path: str) -> dict[str, str]:
    return {"S.$": path}


def number_at(path: str) -> dict[str, str]:
    """A number attribute from a JSON number (DynamoDB takes numbers as strings)."""
    return {"N.$": f"States.Format('{{}}', {path})"}


def job_key(job_id_path: str = "$.job_id") -> dict[str, Any]:
    return {"pk": {"S.$": formatted(keys.job_pk, job_id_path)}, "sk": {"S": keys.JOB_SK}}


def lock_key() -> dict[str, Any]:
    return {"pk": {"S.$": formatted(keys.lock_pk, "$.project")}, "sk": {"S": keys.LOCK_SK}}


def stage_key() -> dict[str, Any]:
    """The stage's record, in its job's stages partition; the sort key comes with the stage
    (relevo_core.execution.execution_input: keys.stage_sk)."""
    return {"pk": {"S.$": formatted(keys.stages_pk, "$.job_id")}, "sk": {"S.$": "$.stage.stage_key"}}


def stage_token_sk(prefix: str) -> dict[str, str]:
    """The sort key of a stage's (or shard's) token in the job's token partition: `prefix`
    (keys.RUN_TOKEN_PREFIX,
    keys.REVIEW_TOKEN_PREFIX) before the stage record's own sort key, as keys.run_token_sk spells it."""
    return {"S.$": f"States.Format('{prefix}{{}}', $.stage.stage_key)"}


def token_item(sk: str | dict[str, str], attributes: dict[str, Any]) -> dict[str, Any]:
    """A transaction's Put of this task's token into the job's token partition (keys.tokens_pk), which no job
    session can read; it expires with the job."""
    return {
        "TableName": TABLE,
        "Item": {
            "pk": {"S.$": formatted(keys.tokens_pk, "$.job_id")},
            "sk": {"S": sk} if isinstance(sk, str) else sk,
            "token": {"S.$": "$$.Task.Token"},
            **attributes,
            "written_at": NOW,
            "ttl": number_at("$.ttl"),
        },
    }


def queue_counter_key() -> dict[str, Any]:
    return {"pk": {"S": keys.QUEUE_COUNTER_PK}, "sk": {"S": keys.COUNTER_SK}}


def expression(
    body: dict[str, Any], names: dict[str, str] | None, values: dict[str, Any] | None
) -> dict[str, Any]:
    if names:
        body["ExpressionAttributeNames"] = names
    if values:
        body["ExpressionAttributeValues"] = values
    return body


def update(
    key: dict[str, Any],
    update_expression: str,
    *,
    condition: str | None = None,
    names: dict[str, str] | None = None,
    values: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The parameters of an UpdateItem (or a transaction's Update) of the table."""
    body: dict[str, Any] = {"TableName": TABLE, "Key": key, "UpdateExpression": update_expression}
    if condition:
        body["ConditionExpression"] = condition
    return expression(body, names, values)


def get(key: dict[str, Any], projection: str, names: dict[str, str] | None = None) -> dict[str, Any]:
    """A strongly consistent GetItem of a few attributes."""
    return expression(
        {"TableName": TABLE, "Key": key, "ConsistentRead": True, "ProjectionExpression": projection},
        names,
        None,
    )


def then(state: State, next_state: str | None) -> State:
    """`Next`, or `End` for None."""
    if next_state is None:
        state["End"] = True
    else:
        state["Next"] = next_state
    return state


def backoff_retry(errors: list[str], attempts: int) -> dict[str, Any]:
    return {
        "ErrorEquals": errors,
        "IntervalSeconds": 1,
        "MaxAttempts": attempts,
        "BackoffRate": 2.0,
        "JitterStrategy": "FULL",
    }


def _conflict() -> list[dict[str, Any]]:
    return [
        {"Variable": "$.conflict.error.Cause", "StringMatches": f"*{reason}*"} for reason in CONFLICT_REASONS
    ]


def transaction(
    name: str,
    items: list[dict[str, Any]],
    *,
    next_state: str | None,
    refused: str | None = None,
    comment: str | None = None,
    canceled_comment: str | None = None,
    kept_conflicting: str = KEPT_CONFLICTING,
    waits_for_token: bool = False,
    before_catch: list[dict[str, Any]] | None = None,
    refusals: list[dict[str, Any]] | None = None,
    result_selector: dict[str, Any] | None = None,
    result_path: str = "$.conflict",
    timeout_path: str | None = None,
    output_path: str | None = None,
    answer_path: str | None = None,
    heartbeat_path: str | None = None,
    after_catch: list[dict[str, Any]] | None = None,
) -> States:
    """A TransactWriteItems task and its conflict retry, the only way this machine writes a
    transaction (tests/infrastructure/test_job_machine.py holds it).

    DynamoDB cancels a transaction for a conflict with another write or a throttle as it does for
    a failed condition ("TransactWriteItems", DynamoDB API Reference: TransactionCanceledException,
    CancellationReasons). A transaction that can be refused (`refused`: where a refusal goes) gets
    three states more: `<name>Canceled` tells a conflict from a refusal by the reasons in the
    Cause, `<name>ConflictBackoff` draws a full-jitter delay below 1, 2, 4, 8, 16 s and
    `<name>ConflictWait` waits it, then the transaction runs again; after CONFLICT_RETRIES
    conflicts it goes to `kept_conflicting`. `refusals` are choices tried before the Default
    (`refused`). One that cannot be refused (no condition anywhere) simply retries its
    cancellation. $.conflict.retries counts the streak; the execution input starts it at 0.

    A transaction that waits for its task token (`waits_for_token`) and whose answer matters puts
    that answer at `answer_path` (whole: no selector), may say its `heartbeat_path`, and takes its
    other catchers before (`before_catch`) and after (`after_catch`) the cancellation's. A retry
    of a waiting transaction hands out a new token: the one it wrote never waited.
    """
    task: State = {"Type": "Task"}
    if comment:
        task["Comment"] = comment
    task["Resource"] = TRANSACT_WRITE_WAITING if waits_for_token else TRANSACT_WRITE
    task["Parameters"] = {"TransactItems": items}
    if timeout_path:
        task["TimeoutSecondsPath"] = timeout_path
    if heartbeat_path:
        task["HeartbeatSecondsPath"] = heartbeat_path
    if refused is None:
        task["ResultPath"] = answer_path
        if output_path:
            task["OutputPath"] = output_path
        task["Retry"] = [backoff_retry([TRANSACTION_CANCELED, INTERNAL_ERROR], CONFLICT_RETRIES)]
        if before_catch or after_catch:
            task["Catch"] = [*(before_catch or []), *(after_catch or [])]
        return {name: then(task, next_state)}
    if answer_path is not None:
        task["ResultPath"] = answer_path
    else:
        task["ResultSelector"] = result_selector if result_selector is not None else {"retries": 0}
        task["ResultPath"] = result_path
    if output_path:
        task["OutputPath"] = output_path
    if not waits_for_token:
        # A task token is handed out once: a waiting transaction is not retried on its own.
        task["Retry"] = [backoff_retry([INTERNAL_ERROR], CONFLICT_RETRIES)]
    task["Catch"] = [
        *(before_catch or []),
        {"ErrorEquals": [TRANSACTION_CANCELED], "ResultPath": "$.conflict.error", "Next": f"{name}Canceled"},
        *(after_catch or []),
    ]
    then(task, next_state)
    canceled: State = {"Type": "Choice"}
    if canceled_comment:
        canceled["Comment"] = canceled_comment
    canceled["Choices"] = [
        {
            "And": [
                {"Or": _conflict()},
                {"Variable": "$.conflict.retries", "NumericLessThan": CONFLICT_RETRIES},
            ],
            "Next": f"{name}ConflictBackoff",
        },
        {"Or": _conflict(), "Next": kept_conflicting},
        *(refusals or []),
    ]
    canceled["Default"] = refused
    delays = ", ".join(str(2**n) for n in range(CONFLICT_RETRIES))
    return {
        name: task,
        f"{name}Canceled": canceled,
        f"{name}ConflictBackoff": {
            "Type": "Pass",
            "Comment": f"Full jitter: a random delay below {delays} s for the 1st to {CONFLICT_RETRIES}th "
            "retry of the conflict.",
            "Parameters": {
                "retries.$": "States.MathAdd($.conflict.retries, 1)",
                "delay_sec.$": f"States.MathRandom(0, States.ArrayGetItem(States.Array({delays}), "
                "$.conflict.retries))",
            },
            "ResultPath": "$.conflict",
            "Next": f"{name}ConflictWait",
        },
        f"{name}ConflictWait": {"Type": "Wait", "SecondsPath": "$.conflict.delay_sec", "Next": name},
    }


def catch_all(next_state: str, result_path: str | None = "$.failure") -> dict[str, Any]:
    """Any error of a task, kept at `result_path`, on to `next_state`."""
    return {"ErrorEquals": ["States.ALL"], "ResultPath": result_path, "Next": next_state}
