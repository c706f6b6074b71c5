"""Access pattern: an agent's claim on a stage attempt, and every write fenced on that claim.

The attempt number is the fencing token. A claim succeeds only when the stage is unclaimed, was
claimed for an earlier attempt, or its holder's lease has run out; every later write requires the
writer to still hold exactly that attempt, so a zombie agent cannot overwrite its successor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store.codec import from_attributes, to_attribute
from relevo_core.store.keys import HELD_BY_INDEX, JOB_SK, job_pk, key, stage_sk
from relevo_core.store.paging import query_items

_HOLDS_ATTEMPT = "agent_id = :agent AND attempt = :attempt"
# For writes to other items (log chunks, artifact records) fenced on this one in a transaction.
HOLDS_ATTEMPT = _HOLDS_ATTEMPT


class Outcome(str, Enum):
    """What is known of an attempt's effect, on its stage record."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # The command was killed or the agent vanished: the effect may or may not exist.
    UNKNOWN = "unknown"
    MANUAL_REVIEW = "manual_review"
    # An operator resolved a manual review (relevo job resolve).
    RESOLVED = "resolved"


def needs_reconcile(previous: dict[str, Any], attempt: int) -> bool:
    """Whether the attempt before `attempt` left an outcome the state machine never learnt: it
    was claimed and never recorded one (lease lost without a receipt), recorded `unknown` (killed),
    or recorded a success whose acknowledgement was lost (the receipt is then re-sent)."""
    earlier = previous.get("attempt")
    if not isinstance(earlier, int) or earlier >= attempt:
        return False
    return previous.get("outcome") in (None, Outcome.UNKNOWN.value, Outcome.SUCCEEDED.value)


def record_reconciled(ref: StageRef, decision: str, evidence: dict[str, Any], now: datetime) -> None:
    """A reconciliation's decision and its evidence, on the stage (fenced on the attempt): the
    latest as `reconciled`, every one in `reconciliations`."""
    entry = {"attempt": ref.attempt, "agent_id": ref.agent_id, "decision": decision, "evidence": evidence, "at": now.isoformat()}
    _update(
        ref,
        "SET #status = :reconciled, reconciled = :entry, "
        "reconciliations = list_append(if_not_exists(reconciliations, :none), :entries), last_writer = :writer",
        _HOLDS_ATTEMPT,
        {
            ":reconciled": StageStatus.RECONCILED.value,
            ":entry": entry,
            ":entries": [entry],
            ":none": [],
            ":writer": f"agent:{ref.agent_id}",
            ":agent": ref.agent_id,
            ":attempt": ref.attempt,
        },
    )


def held_by(table: str, agent_id: str) -> list[dict[str, Any]]:
    """The stage attempts `agent_id` claimed and never finished (a sparse index: the claim sets
    `held_by`, the fenced finish removes it). What a restarting agent compares with its journal."""
    return list(
        query_items(
            TableName=table,
            IndexName=HELD_BY_INDEX,
            KeyConditionExpression="held_by = :agent",
            ExpressionAttributeValues={":agent": {"S": agent_id}},
        )
    )


class LeaseLost(Exception):
    """The write was refused: this agent no longer holds the attempt."""


@dataclass(frozen=True)
class StageRef:
    table: str
    job_id: str
    stage_index: int
    attempt: int
    agent_id: str

    @property
    def key(self) -> dict[str, dict[str, str]]:
        return key(job_pk(self.job_id), stage_sk(self.stage_index))


def holds_attempt_values(ref: StageRef) -> dict[str, dict[str, str]]:
    """Expression values for HOLDS_ATTEMPT, in a ConditionCheck on the stage item."""
    return {":agent": to_attribute(ref.agent_id), ":attempt": to_attribute(ref.attempt)}


def _update(
    ref: StageRef, expression: str, condition: str, values: dict[str, object], return_old: bool = False
) -> dict[str, Any]:
    request: dict[str, object] = {
        "TableName": ref.table,
        "Key": ref.key,
        "UpdateExpression": expression,
        "ConditionExpression": condition,
        "ExpressionAttributeValues": {name: to_attribute(value) for name, value in values.items()},
    }
    if "#status" in expression:
        # DynamoDB refuses names the expressions do not use.
        request["ExpressionAttributeNames"] = {"#status": "status"}
    if return_old:
        request["ReturnValues"] = "ALL_OLD"
    try:
        response = client("dynamodb").update_item(**request)
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
            raise LeaseLost(f"{ref.job_id} stage {ref.stage_index} attempt {ref.attempt}") from exc
        raise
    return from_attributes(response.get("Attributes", {}))


def _lease_until(now: datetime, lease_ttl_sec: int) -> tuple[int, str]:
    """The lease's end as epoch seconds (for conditions) and as the ISO text the state machine
    compares with its own clock when a task times out."""
    until = now + timedelta(seconds=lease_ttl_sec)
    return int(until.timestamp()), until.astimezone(timezone.utc).isoformat()


def claim(
    ref: StageRef,
    lease_ttl_sec: int,
    now: datetime,
    precondition_version: str | None = None,
    enqueued_at: datetime | None = None,
) -> dict[str, Any]:
    """Claim the operation's attempt. Returns the stage record as it was before the claim: what
    the previous attempt left (its outcome, receipt, precondition) is what reconciliation reads.
    `enqueued_at` is when the queue accepted the attempt's message (SQS SentTimestamp): with
    `started_at` it shows how long the attempt waited for a Mac."""
    epoch = int(now.timestamp())
    lease, lease_iso = _lease_until(now, lease_ttl_sec)
    return _update(
        ref,
        "SET #status = :running, agent_id = :agent, attempt = :attempt, lease_expires_at = :lease, "
        "lease_expires_iso = :lease_iso, started_at = :now, enqueued_at = :enqueued, last_writer = :writer, "
        "precondition_version = :pre, held_by = :agent "
        "REMOVE exit_code, error_class, ended_at, run_token, outcome, receipt",
        "attribute_exists(pk) AND (attribute_not_exists(attempt) OR attempt < :attempt "
        "OR (attempt = :attempt AND lease_expires_at < :epoch))",
        {
            ":running": StageStatus.RUNNING.value,
            ":agent": ref.agent_id,
            ":attempt": ref.attempt,
            ":lease": lease,
            ":lease_iso": lease_iso,
            ":epoch": epoch,
            ":now": now.isoformat(),
            ":enqueued": (enqueued_at or now).isoformat(),
            ":writer": f"agent:{ref.agent_id}",
            ":pre": precondition_version or "",
        },
        return_old=True,
    )


def renew_lease(ref: StageRef, lease_ttl_sec: int, now: datetime) -> None:
    lease, lease_iso = _lease_until(now, lease_ttl_sec)
    _update(
        ref,
        "SET lease_expires_at = :lease, lease_expires_iso = :lease_iso",
        _HOLDS_ATTEMPT,
        {":agent": ref.agent_id, ":attempt": ref.attempt, ":lease": lease, ":lease_iso": lease_iso},
    )


def run_token(ref: StageRef) -> str | None:
    """The token the state machine hands the holder of this attempt once it saw the claim."""
    item = client("dynamodb").get_item(
        TableName=ref.table, Key=ref.key, ConsistentRead=True, ProjectionExpression="agent_id, attempt, run_token"
    ).get("Item", {})
    if item.get("agent_id", {}).get("S") != ref.agent_id or item.get("attempt", {}).get("N") != str(ref.attempt):
        raise LeaseLost(f"{ref.job_id} stage {ref.stage_index} attempt {ref.attempt}")
    return item.get("run_token", {}).get("S")


def finish(
    ref: StageRef,
    status: StageStatus,
    now: datetime,
    exit_code: int | None,
    error_class: str | None,
    stage_name: str | None = None,
    receipt: dict[str, Any] | None = None,
    outcome: Outcome | None = None,
) -> None:
    """Record the attempt's outcome, fenced on the attempt. A success also becomes the job's
    last successful stage in the same transaction (the state machine spends no state on it).

    `outcome` says what is known of the command's effect: a receipt goes with `succeeded` or
    `failed`; a command that was killed (fenced, canceled, shut down) is `unknown`, so the next
    attempt reconciles before it runs anything."""
    values: dict[str, object] = {
        ":status": status.value,
        ":agent": ref.agent_id,
        ":attempt": ref.attempt,
        ":now": now.isoformat(),
        ":writer": f"agent:{ref.agent_id}",
        ":exit": exit_code if exit_code is not None else -1,
        ":error": error_class or "",
    }
    expression = "SET #status = :status, ended_at = :now, last_writer = :writer, exit_code = :exit, error_class = :error"
    if outcome is None:
        outcome = Outcome.SUCCEEDED if status is StageStatus.SUCCEEDED else Outcome.FAILED
    expression += ", outcome = :outcome"
    values[":outcome"] = outcome.value
    if receipt is not None:
        expression += ", receipt = :receipt"
        values[":receipt"] = receipt
    expression += " REMOVE held_by"
    if status is not StageStatus.SUCCEEDED or stage_name is None:
        _update(ref, expression, _HOLDS_ATTEMPT, values)
        return
    try:
        client("dynamodb").transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": ref.table,
                        "Key": ref.key,
                        "UpdateExpression": expression,
                        "ConditionExpression": _HOLDS_ATTEMPT,
                        "ExpressionAttributeNames": {"#status": "status"},
                        "ExpressionAttributeValues": {name: to_attribute(value) for name, value in values.items()},
                    }
                },
                {
                    "Update": {
                        "TableName": ref.table,
                        "Key": key(job_pk(ref.job_id), JOB_SK),
                        "UpdateExpression": "SET last_successful_stage = :stage, last_writer = :writer, updated_at = :now",
                        "ExpressionAttributeValues": {
                            ":stage": to_attribute(stage_name),
                            ":writer": to_attribute(f"agent:{ref.agent_id}"),
                            ":now": to_attribute(now.isoformat()),
                        },
                    }
                },
            ]
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "TransactionCanceledException":
            raise LeaseLost(f"{ref.job_id} stage {ref.stage_index} attempt {ref.attempt}") from exc
        raise
