"""Each attempt of a stage (or of one shard of it): the stage record says it is dispatched, the
stage message goes to the region's queue and waits for a claim (renewed while a pause holds the
region), then the claimer gets its run token and the attempt runs until its agent answers.

The message is relevo_core.models.stage_message.StageMessage, written field by field from the
model (message_body): a field of the model without a source here fails the build."""

from __future__ import annotations

from relevo_core.execution import PAUSE_HOLD_SEC
from relevo_core.models.errors import ErrorClass
from relevo_core.models.stage_message import StageMessage
from relevo_core.models.status import StageStatus
from relevo_core.store import keys
from relevo_tools.job_machine.asl import (
    NOW,
    STATUS,
    TABLE,
    WRITER,
    States,
    backoff_retry,
    catch_all,
    formatted,
    number_at,
    stage_key,
    stage_token_sk,
    string_at,
    token_item,
    transaction,
    update,
)

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
            "Comment": "Projection: the attempt is on the region's queue, once the stage passed its "
            "approval gate (a gated stage's "
            "write is refused until it was approved: see GATE_CONDITION in "
            "tools/relevo_tools/job_machine/dispatch.py). `attempt` itself is written only by the claiming "
            "agent (it "
            "is the fencing token). Draws the attempt's dispatch key (States.UUID), which only its stage "
            "message carries: the claim "
            "function claims the attempt only for a caller that shows it, so an agent claims nothing it was "
            "not handed. Returns the "
            "agents that ran the stage's failed attempts, which the dispatch carries so a retry prefers "
            "another agent. ALL_NEW rather "
            "than UPDATED_NEW: moto 5.2.5 leaves an attribute out of UPDATED_NEW when its value did not "
            "change (if_not_exists), and "
            "the result selector only keeps failed_agents. The stage record carries the job's ttl, so it "
            "expires with the job.",
            "Resource": "arn:aws:states:::dynamodb:updateItem",
            "Parameters": {
                **update(
                    stage_key(),
                    "SET #status = :dispatched, stage_name = :name, stage_index = :index, dispatched_at = "
                    ":now, dispatched_attempt = "
                    ":attempt, retry_count = :retries, cumulative_backoff_sec = :backoff, last_writer = "
                    ":writer, failed_agents = "
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
            "Comment": "Waits for a claim only: queue_timeout_sec (dispatch_wait_sec) bounds the time no "
            "agent took it "
            "(Relevo.Timeout.Queue), unless a pause was in force in the region when it ran out "
            "(CheckRegionPauses): a pause never "
            "fails a job. The claiming agent answers with its id and attempt. A retry names the agents of "
            "the failed attempts "
            "(avoid_agents): they leave it to any other online agent of the region, busy or not, and run it "
            "themselves only when "
            "none is online (or after the agent's handoff_max_wait_sec safety bound). The message carries "
            "the dispatch key the claim "
            "needs, and what an agent decides before it claims (the project's workspace, the lease, whether "
            "the plan signs); the "
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
                catch_all("EnsureCause"),
            ],
            "Next": "AwaitResult",
        },
        "CheckRegionPauses": {
            "Type": "Task",
            "Comment": "The queue wait ran out. Was any pause of the region in force (an agent's pause or "
            "drain, or the region's "
            "dispatch pause, stored until a later time than now)? Pause items keep `until` as an ISO 8601 "
            "UTC string, which compares "
            "in time order as a string. A pause keeps agents from claiming, so the wait is renewed rather "
            "than failed (issue 20: a "
            "job never fails because of a pause). A read that keeps failing ends the wait as before.",
            "Resource": "arn:aws:states:::aws-sdk:dynamodb:query",
            "Parameters": {
                "TableName": TABLE,
                "KeyConditionExpression": "pk = :pk AND begins_with(sk, :pause)",
                "FilterExpression": "#until > :now",
                "ExpressionAttributeNames": {"#until": "until"},
                "ExpressionAttributeValues": {
                    ":pk": string_at(formatted(keys.pauses_pk, "$.region")),
                    # Every pause of the region: each agent's (PAUSE#id) and the region's dispatch pause
                    # (PAUSE).
                    ":pause": {"S": keys.DISPATCH_PAUSE_SK},
                    ":now": NOW,
                },
                "Select": "COUNT",
                "ConsistentRead": True,
            },
            "ResultSelector": {"in_force.$": "$.Count"},
            "ResultPath": "$.pauses",
            "Retry": [backoff_retry(["States.ALL"], 3)],
            "Catch": [catch_all("QueueTimedOut", None)],
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
            "Comment": "The stage's queue wait is renewed while its region is paused: counted on the stage "
            "(pause_holds, "
            "last_pause_hold_at) for the job view. The same attempt is sent again with a new token; a claim "
            "of the earlier message's "
            "token is answered as no longer waiting, and that agent lets its claim go at once "
            "(relevo_agent.stage).",
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
            "Comment": "While a pause holds the stage, each renewed wait lasts at least an hour (or the "
            "project's queue_timeout_sec if "
            "longer): a pause of at most 7 days then costs at most 169 renewals, about 3,700 history events "
            "(22 each), whatever a short "
            "queue_timeout_sec, well within the 25,000-event quota. A resumed agent claims the waiting "
            "message at once; the wait "
            "only bounds how long no agent does."
            + (
                " A shard's lasts an hour for each shard that may wait beside it "
                "(stage.shards.pause_hold_sec: "
                "relevo_core.execution.shard_pause_hold_sec), so the stage's shards together renew about as "
                "often as one stage "
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
        comment="Hands the claimer a run token (kept in the job's token partition, which no job session "
        "reads; the stage "
        "record says run_handed_at, written only if the claim still holds the attempt), then waits. The "
        "agent renews its lease every min(lease/3, 3 s) "
        "and heartbeats through its region's heartbeat route every lease/3, and ends the command "
        "itself at "
        "exec_timeout_sec. A heartbeat lapse (HeartbeatSeconds = lease_ttl_sec) is a lost lease, retryable; "
        "TimeoutSeconds "
        "(exec + kill grace + lease, counted from here, on this clock) is the backstop for a live agent "
        "that never ended its "
        "command: an exec timeout. Each is caught by its own name, States.HeartbeatTimeout first: AWS scans "
        "catchers in order "
        "and States.Timeout also names a heartbeat lapse. The queue wait is over, so it never counts "
        "against the lease. The "
        "agent's outcome route answers with {stage, attempt, agent_id, status} of the fenced stage record: "
        "the Map keeps one "
        "per stage, and a stage that ended `warning` is said on the job record at its end (MarkSucceeded). "
        "A cancelled "
        "transaction is a conflict (retried with a new token) or the claim no longer holding the attempt "
        "(failed as before).",
        canceled_comment="The run token was not handed: a conflict (the agent renewing its lease at that "
        "moment) is retried; "
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
        after_catch=[catch_all("EnsureCause")],
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
