"""The one home of execution plumbing: starting, stopping, naming and describing a job's Step
Functions execution, answering the task tokens it waits on, resolving the region's work queue,
and building the execution's input. Logic modules call these; none calls Step Functions or SQS
for an execution itself (tests/unit/test_import_graph.py holds it)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.config import IntakeSettings
from relevo_core.models.envelope import JobEnvelope
from relevo_core.models.errors import ErrorClass, ErrorCode, RelevoError
from relevo_core.models.plan import MAX_APPROVAL_TIMEOUT_SEC, StagePlan
from relevo_core.store.keys import shard_sk, stage_sk


@lru_cache(maxsize=64)
def work_queue_url(prefix: str, region_affinity: str) -> str:
    """The region's work queue, resolved once per container."""
    try:
        return client("sqs").get_queue_url(QueueName=f"{prefix}{region_affinity}")["QueueUrl"]
    except ClientError as exc:
        if error_code(exc) in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"):
            raise RelevoError(
                ErrorCode.REGION_UNKNOWN,
                f"region_affinity {region_affinity!r} has no work queue in this stack",
            ) from exc
        raise


# The state machine's key for each retryable class in a stage's `attempts`.
RETRY_KEYS: dict[ErrorClass, str] = {
    ErrorClass.NETWORK_TIMEOUT: "network_timeout",
    ErrorClass.CONNECTION_RESET: "connection_reset",
    ErrorClass.STORAGE_5XX: "storage_5xx",
    ErrorClass.TRANSIENT_EXIT: "transient_exit",
    ErrorClass.AGENT_SHUTDOWN: "agent_shutdown",
    ErrorClass.LEASE_EXPIRED: "lease_expired",
}

# A job waiting for its project parks in job.asl.json's WaitForProject until a releaser wakes it
# (the releasing execution, cancel, the sweeper), and reads the lock again at least every
# fallback_sec in case a wake never comes. Every park, woken or not, spends one of `cycles`, and
# the job gives up with Relevo.Timeout.Queue when they are spent, so a wait of queue_timeout_sec
# costs at most `cycles` parks of history however long each lasts (test_waiting_history.py).
# Short waits read the lock LOCK_WAIT_READS times; long ones every LOCK_WAIT_MAX_FALLBACK_SEC:
# 288 parks for the longest queue_timeout_sec (24 h).
LOCK_WAIT_READS = 100
LOCK_WAIT_MAX_FALLBACK_SEC = 300


def lock_wait(queue_timeout_sec: int) -> dict[str, int]:
    """The wait budget job.asl.json's WaitForProject / CountWaitCycle spend: the fallback read
    period and the number of parks a wait of queue_timeout_sec may use."""
    fallback_sec = min(LOCK_WAIT_MAX_FALLBACK_SEC, max(1, math.ceil(queue_timeout_sec / LOCK_WAIT_READS)))
    return {"fallback_sec": fallback_sec, "cycles": math.ceil(queue_timeout_sec / fallback_sec)}


# While the job holding the project's lock waits at its approval gate (AwaitApproval writes `gate`
# on the lock, MarkApproved and every release take it off), a job queued behind it does not spend
# its queue timeout, which is the wait for a Mac: it parks in WaitBehindGate for GATE_PARK_SEC at
# a time, woken like any waiter when the lock is freed, and each such park spends one of `parks`,
# enough for the longest gate and the park an approval interrupts. Its queue timeout counts
# again from its next read of the lock, at most GATE_PARK_SEC after the approval. Once they are
# spent (gates one after another) a gate's wait counts as any other, so a wait costs at most
# lock_wait's cycles plus these parks of history (test_waiting_history.py).
GATE_PARK_SEC = 2 * 3600


def gate_wait() -> dict[str, int]:
    """The parks job.asl.json's WaitBehindGate / CountGateCycle spend while the project's lock
    holder waits for approval."""
    return {"park_sec": GATE_PARK_SEC, "parks": math.ceil(MAX_APPROVAL_TIMEOUT_SEC / GATE_PARK_SEC) + 1}


def _attribute(name: str | None) -> dict[str, Any]:
    return {"S": name} if name is not None else {"NULL": True}


# Added to a stage's `gate` when it has shards: its own dispatch write is refused, and the
# refusal leads to the fan-out over its shards (job.asl.json: GatedOrSharded).
FANS_OUT = 2

# While a pause of the region holds a dispatch nobody claims, its wait is renewed lasting at least
# PAUSE_HOLD_SEC (or queue_timeout_sec if longer): a 7-day pause then renews a stage's wait at
# most 169 times. The shards of a stage wait side by side, up to `max_parallel` (0: all) of them,
# so each shard's renewed wait lasts that many times longer: the stage's shards together renew
# about as often as one stage does (relevo_core.plan_limits: pause holds). A resumed agent claims
# a waiting message at once, however long its wait; the wait only bounds how long after a pause
# the stage fails when no agent claims it, and stays under the work queue's message retention
# (4 days) at the largest fan-out (45 h).
PAUSE_HOLD_SEC = 3600


def shard_pause_hold_sec(shard_count: int, max_parallel: int | None) -> int:
    """How long a shard's queue wait lasts once renewed because a pause held it."""
    return PAUSE_HOLD_SEC * min(shard_count, max_parallel or shard_count)


def _fan_out(stage: StagePlan, index: int) -> dict[str, Any]:
    """What the state machine needs to fan a stage with shards out: each shard's index and record
    key, whether the first to fail stops the others, how many run at once (0: all). Each shard's
    agent reads its matrix values from the envelope (StagePlan.shards), so the execution input
    stays small (relevo_core.plan_limits)."""
    if not stage.sharded:
        return {}
    return {
        "shards": {
            "items": [
                {"shard": shard, "stage_key": shard_sk(index, shard)} for shard in range(stage.shard_count)
            ],
            "count": stage.shard_count,
            "fail_fast": stage.stops_siblings,
            "max_parallel": stage.max_parallel or 0,
            "pause_hold_sec": shard_pause_hold_sec(stage.shard_count, stage.max_parallel),
        }
    }


def execution_input(envelope: JobEnvelope, queue_url: str) -> dict[str, Any]:
    """What the state machine needs to drive the job; the agent reads the rest from the envelope.
    Timeouts, attempts and backoff all come from the frozen plan."""
    gated = envelope.approval.gated_stage([stage.name for stage in envelope.stages])
    return {
        "job_id": envelope.job_id,
        "project": envelope.project,
        # Carried for the dead-letter entry, which must be enough to resume the job.
        "envelope": envelope.to_json_dict(),
        "queue_url": queue_url,
        "lease_ttl_sec": envelope.lease_ttl_sec,
        # On each stage's message with the project and the lease, what an agent decides before it
        # claims: whether the plan signs (a signing stage runs alone on its Mac). The claim's
        # answer carries the envelope.
        "signs": envelope.signing is not None,
        "queue_timeout_sec": envelope.queue_timeout_sec,
        # How a job waiting for its project's lock parks (see lock_wait).
        "lock_wait": lock_wait(envelope.queue_timeout_sec),
        # How it parks while the job holding the lock waits at its approval gate (see gate_wait).
        "gate_wait": gate_wait(),
        # The streak of conflicts the current transactional state has retried (job.asl.json's
        # <State>Canceled choices retry at most 5, with backoff and full jitter).
        "conflict": {"retries": 0},
        # The job's last successful stage once it succeeded (MarkSucceeded): the state machine
        # writes it, never an agent.
        "last_stage": envelope.stages[-1].name,
        # A job from a later stage runs only that stage on; the earlier ones show as skipped.
        "stages": [
            {
                **_fan_out(stage, index),
                "index": index,
                "name": stage.name,
                "stage_key": stage_sk(index),
                # The agent ends a stage at its exec timeout; the state machine's own limit is a
                # backstop after the kill grace and one more lease.
                "exec_backstop_sec": stage.exec_timeout_sec + stage.kill_grace_sec + envelope.lease_ttl_sec,
                "attempts": {key: stage.retry.attempts_for(error) for error, key in RETRY_KEYS.items()},
                "backoff_caps_sec": stage.retry.backoff_caps_sec(),
                # 1 for the plan's gated stage, else 0: it picks the gate condition of the stage's
                # dispatch in job.asl.json (tools/relevo_tools/job_machine/dispatch.py, GATE_CONDITION).
                "gate": int(stage.name == gated) + (FANS_OUT if stage.sharded else 0),
                "approval_timeout_sec": envelope.approval.effective_timeout_sec,
                # On the stage's message: an agent that does not match leaves it to one that does.
                "requires": stage.requires,
                # The job's last successful stage should this one fail: the one before it, or
                # for the first that runs, what the job stands on; as the DynamoDB attribute
                # value the state machine writes (RecordLastSuccess), NULL for none.
                "previous_success": _attribute(
                    envelope.stages[index - 1].name
                    if index > envelope.first_stage_index
                    else envelope.stands_on
                ),
            }
            for index, stage in enumerate(envelope.stages)
            if index >= envelope.first_stage_index
        ],
    }


def start_execution(state_machine_arn: str, envelope: JobEnvelope, queue_url: str) -> None:
    """Start the job's execution, named by its job id so a second start cannot run it twice."""
    try:
        client("stepfunctions").start_execution(
            stateMachineArn=state_machine_arn,
            name=envelope.job_id,
            input=json.dumps(execution_input(envelope, queue_url)),
        )
    except ClientError as exc:
        # AWS answers success for an open execution with the same name and input; the emulator
        # raises ExecutionAlreadyExists. Either way the job is already started.
        if error_code(exc) != "ExecutionAlreadyExists":
            raise


def start_job_execution(settings: IntakeSettings, envelope: JobEnvelope, took_lock: bool = False) -> None:
    """Start the execution of a job already written (a release, a redrive, a forgotten start): on
    the queued machine, which takes the project's lock or waits for it (and, for a job that holds
    it already, goes on to its stages), or on the common one for a job written holding its lock."""
    start_execution(
        settings.state_machine_arn if took_lock else settings.queued_state_machine_arn,
        envelope,
        work_queue_url(settings.work_queue_prefix, envelope.region_affinity),
    )


def execution_arn(state_machine_arn: str, name: str) -> str:
    return state_machine_arn.replace(":stateMachine:", ":execution:", 1) + f":{name}"


def execution_history(machines: Sequence[str], name: str) -> Iterator[dict[str, Any]]:
    """Every event of the job's execution's history (on whichever of `machines` runs it, config's
    ExecutionSettings.machines), oldest first, without its inputs and outputs;
    ExecutionDoesNotExist (a ClientError) when no execution has that name."""
    stepfunctions = client("stepfunctions")
    for state_machine_arn in machines:
        kwargs: dict[str, Any] = {
            "executionArn": execution_arn(state_machine_arn, name),
            "maxResults": 1000,
            "includeExecutionData": False,
        }
        try:
            page = stepfunctions.get_execution_history(**kwargs)
        except ClientError as exc:
            if error_code(exc) != "ExecutionDoesNotExist" or state_machine_arn == machines[-1]:
                raise
            continue
        while True:
            yield from page["events"]
            if not page.get("nextToken"):
                return
            kwargs["nextToken"] = page["nextToken"]
            page = stepfunctions.get_execution_history(**kwargs)


# DescribeExecution's answer for an execution that was never started.
MISSING = "MISSING"


def execution_status(machines: Sequence[str], name: str) -> str:
    """RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ABORTED, PENDING_REDRIVE, or MISSING when none of
    `machines` has an execution of that name (DescribeExecution: ExecutionDoesNotExist). The
    common machine comes first: a queued job's status costs one call more."""
    for state_machine_arn in machines:
        try:
            described = client("stepfunctions").describe_execution(
                executionArn=execution_arn(state_machine_arn, name)
            )
        except ClientError as exc:
            if error_code(exc) != "ExecutionDoesNotExist":
                raise
            continue
        return str(described["status"])
    return MISSING


def stop_execution(machines: Sequence[str], name: str, cause: str) -> None:
    """Stop the job's execution, on whichever of `machines` runs it; one that does not exist (a
    job never started) is already stopped."""
    for state_machine_arn in machines:
        try:
            client("stepfunctions").stop_execution(
                executionArn=execution_arn(state_machine_arn, name), cause=cause
            )
        except ClientError as exc:
            if error_code(exc) != "ExecutionDoesNotExist":
                raise


class TaskGone(Exception):
    """The task a token belonged to no longer waits: it timed out, or its execution ended."""


# SendTaskSuccess / SendTaskFailure refusals that mean the waiting task is gone.
_TASK_GONE = frozenset({"TaskTimedOut", "TaskDoesNotExist", "InvalidToken"})


def succeed_task(token: str, output: dict[str, Any]) -> None:
    """Answer a waiting task (approval gate, manual review, a parked wait for the project's lock)
    with success; TaskGone if it no longer waits."""
    try:
        client("stepfunctions").send_task_success(taskToken=token, output=json.dumps(output))
    except ClientError as exc:
        if error_code(exc) in _TASK_GONE:
            raise TaskGone(error_code(exc)) from exc
        raise


def fail_task(token: str, error: str, cause: str) -> None:
    """Answer a waiting task with failure `error`; TaskGone if it no longer waits."""
    try:
        client("stepfunctions").send_task_failure(taskToken=token, error=error, cause=cause)
    except ClientError as exc:
        if error_code(exc) in _TASK_GONE:
            raise TaskGone(error_code(exc)) from exc
        raise


def heartbeat_task(token: str) -> None:
    """Tell a waiting task (an attempt's run) that its worker is alive; TaskGone if it no longer waits."""
    try:
        client("stepfunctions").send_task_heartbeat(taskToken=token)
    except ClientError as exc:
        if error_code(exc) in _TASK_GONE:
            raise TaskGone(error_code(exc)) from exc
        raise


def send_report_dead_letter(queue_url: str, message: dict[str, Any]) -> None:
    """A status or notification the reporter could not deliver, onto its own dead-letter queue
    (StatusDeadLetterQueue): the event, the request less its headers, each attempt's failure."""
    client("sqs").send_message(QueueUrl=queue_url, MessageBody=json.dumps(message))
