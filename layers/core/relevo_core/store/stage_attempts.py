"""Access pattern: the writes of a claimed stage attempt, each fenced on that claim.

The attempt number is the fencing token. A claim (store/stage_claims) succeeds only when the stage
is unclaimed, was claimed for an earlier attempt, or its holder's lease has run out; every later
write requires the writer to still hold exactly that attempt, so a zombie agent cannot overwrite
its successor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.models.status import StageStatus
from relevo_core.models.transfer import TransferProgress
from relevo_core.store.codec import from_attributes, to_attribute
from relevo_core.store.keys import stage_key

# The writer holds the attempt, and the attempt is live: not yet finished, not given up by the
# state machine (dispatched again, failed) and not ended with its job (canceled).
_HOLDS_ATTEMPT = "agent_id = :agent AND attempt = :attempt AND #status IN (:live_running, :live_reconciled)"
# For writes to other items (log chunks, artifact records) fenced on this one in a transaction:
# use holds_attempt_check(ref).
HOLDS_ATTEMPT = _HOLDS_ATTEMPT
# HOLDS_ATTEMPT's live statuses, as expression values.
LIVE_VALUES = {":live_running": StageStatus.RUNNING.value, ":live_reconciled": StageStatus.RECONCILED.value}
# A stage in one of these was ended by its job (or never runs): no attempt may claim it.
ENDED_STATUSES = (StageStatus.CANCELED.value, StageStatus.SKIPPED.value)


class AttemptOutcome(str, Enum):
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
    return previous.get("outcome") in (None, AttemptOutcome.UNKNOWN.value, AttemptOutcome.SUCCEEDED.value)


def record_reconciled(ref: StageRef, decision: str, evidence: dict[str, Any], now: datetime) -> None:
    """A reconciliation's decision and its evidence, on the stage (fenced on the attempt): the
    latest as `reconciled`, every one in `reconciliations`."""
    entry = {
        "attempt": ref.attempt,
        "agent_id": ref.agent_id,
        "decision": decision,
        "evidence": evidence,
        "at": now.isoformat(),
    }
    update_stage_record(
        ref,
        "SET #status = :reconciled, reconciled = :entry, "
        "reconciliations = list_append(if_not_exists(reconciliations, :none), :entries), last_writer = "
        ":writer",
        _HOLDS_ATTEMPT,
        {
            ":reconciled": StageStatus.RECONCILED.value,
            ":entry": entry,
            ":entries": [entry],
            ":none": [],
            ":writer": f"agent:{ref.agent_id}",
            ":agent": ref.agent_id,
            ":attempt": ref.attempt,
            **LIVE_VALUES,
        },
    )


class LeaseLost(Exception):
    """The write was refused: this agent no longer holds the attempt. `item` is the stage record
    as DynamoDB found it (ReturnValuesOnConditionCheckFailure=ALL_OLD), when it said."""

    def __init__(self, message: str, item: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.item = item or {}

    @property
    def ended(self) -> bool:
        """The stage was ended with its job (canceled): not taken over by another attempt."""
        return self.item.get("status") in ENDED_STATUSES


@dataclass(frozen=True)
class StageRef:
    table: str
    job_id: str
    stage_index: int
    attempt: int
    agent_id: str
    # The shard of a stage with shards (its own record, keys.shard_sk); None for a stage without.
    shard: int | None = None

    @property
    def key(self) -> dict[str, dict[str, str]]:
        return stage_key(self.job_id, self.stage_index, self.shard)


def holds_attempt_values(ref: StageRef) -> dict[str, dict[str, str]]:
    """Expression values for HOLDS_ATTEMPT."""
    return {
        ":agent": to_attribute(ref.agent_id),
        ":attempt": to_attribute(ref.attempt),
        **{name: to_attribute(value) for name, value in LIVE_VALUES.items()},
    }


def holds_attempt_check(ref: StageRef, **values: dict[str, Any]) -> dict[str, Any]:
    """ConditionExpression, names and values of HOLDS_ATTEMPT for a write (or a transaction's
    ConditionCheck) fenced on this attempt; `values` are the write's own expression values."""
    return {
        "ConditionExpression": HOLDS_ATTEMPT,
        "ExpressionAttributeNames": {"#status": "status"},
        "ExpressionAttributeValues": {**holds_attempt_values(ref), **values},
    }


def update_stage_record(
    ref: StageRef,
    expression: str,
    condition: str,
    values: dict[str, object],
    return_old: bool = False,
    names: dict[str, str] | None = None,
) -> dict[str, Any]:
    request: dict[str, object] = {
        "TableName": ref.table,
        "Key": ref.key,
        "UpdateExpression": expression,
        "ConditionExpression": condition,
        "ExpressionAttributeValues": {name: to_attribute(value) for name, value in values.items()},
        # A refusal says what it found, at no extra read (DynamoDB UpdateItem,
        # ReturnValuesOnConditionCheckFailure): who holds the stage now, or that it ended.
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    names = dict(names or {})
    if "#status" in expression or "#status" in condition:
        # DynamoDB refuses names the expressions do not use.
        names["#status"] = "status"
    if names:
        request["ExpressionAttributeNames"] = names
    if return_old:
        request["ReturnValues"] = "ALL_OLD"
    try:
        response = client("dynamodb").update_item(**request)
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            found = from_attributes(exc.response.get("Item", {}))  # type: ignore[arg-type]  # stubs lack Item
            raise LeaseLost(f"{ref.job_id} stage {ref.stage_index} attempt {ref.attempt}", found) from exc
        raise
    return from_attributes(response.get("Attributes", {}))


def lease_until(now: datetime, lease_ttl_sec: int) -> tuple[int, str]:
    """The lease's end as epoch seconds (for conditions) and as the ISO text the state machine
    compares with its own clock when a task times out."""
    until = now + timedelta(seconds=lease_ttl_sec)
    return int(until.timestamp()), until.astimezone(UTC).isoformat()


def renew_lease(
    ref: StageRef, lease_ttl_sec: int, now: datetime, transfer: TransferProgress | None = None
) -> None:
    """Refused (LeaseLost) once the attempt is no longer live: taken over, given up by the state
    machine, or canceled with its job (`LeaseLost.ended`). `transfer`: the attempt's upload
    progress, carried by the same write (no write of its own while the lease is kept)."""
    lease, lease_iso = lease_until(now, lease_ttl_sec)
    values: dict[str, object] = {
        ":agent": ref.agent_id,
        ":attempt": ref.attempt,
        ":lease": lease,
        ":lease_iso": lease_iso,
        **LIVE_VALUES,
    }
    expression = "SET lease_expires_at = :lease, lease_expires_iso = :lease_iso"
    names = None
    if transfer is not None:
        expression += ", transfers.#transfer_attempt = :transfer"
        values[":transfer"] = _transfer_value(ref, transfer)
        names = {"#transfer_attempt": str(ref.attempt)}
    update_stage_record(ref, expression, _HOLDS_ATTEMPT, values, names=names)


def record_transfer(ref: StageRef, transfer: TransferProgress) -> None:
    """The attempt's transfer as its upload ended (totals, or how far it got), fenced on the
    attempt: refused (LeaseLost) once another attempt holds the stage."""
    update_stage_record(
        ref,
        "SET transfers.#transfer_attempt = :transfer",
        _HOLDS_ATTEMPT,
        {
            ":agent": ref.agent_id,
            ":attempt": ref.attempt,
            ":transfer": _transfer_value(ref, transfer),
            **LIVE_VALUES,
        },
        names={"#transfer_attempt": str(ref.attempt)},
    )


def _transfer_value(ref: StageRef, transfer: TransferProgress) -> dict[str, Any]:
    if transfer.attempt != ref.attempt:
        raise ValueError(f"attempt {ref.attempt} cannot record attempt {transfer.attempt}'s transfer")
    return transfer.model_dump(mode="json")


def record_outputs(ref: StageRef, outputs: dict[str, str]) -> None:
    """The values the attempt's command has written to $RELEVO_OUTPUT so far (all of them: the
    latest write wins), fenced on the attempt: refused (LeaseLost) once it is no longer held."""
    update_stage_record(
        ref,
        "SET outputs = :outputs",
        _HOLDS_ATTEMPT,
        {":outputs": outputs, ":agent": ref.agent_id, ":attempt": ref.attempt, **LIVE_VALUES},
    )


def record_restored(ref: StageRef, restored: dict[str, Any]) -> None:
    """What the attempt's agent restored of the earlier stages' handoffs, fenced on the attempt."""
    update_stage_record(
        ref,
        "SET restored = :restored",
        _HOLDS_ATTEMPT,
        {":restored": restored, ":agent": ref.agent_id, ":attempt": ref.attempt, **LIVE_VALUES},
    )


def record_caches(ref: StageRef, caches: list[dict[str, Any]]) -> None:
    """What became of the attempt's caches (relevo_core.models.cache.CacheOutcome: hit, partial
    hit or miss, saved or not, bytes and seconds), fenced on the attempt."""
    update_stage_record(
        ref,
        "SET caches = :caches",
        _HOLDS_ATTEMPT,
        {":caches": caches, ":agent": ref.agent_id, ":attempt": ref.attempt, **LIVE_VALUES},
    )


def record_checkout_commit(ref: StageRef, commit: str) -> str:
    """The commit the job's ref resolved to at its first checkout, on this stage's record, fenced
    on the attempt; a commit an earlier attempt recorded stays. Returns the commit on record: the
    one every later stage, retry and rerun of the job builds."""
    try:
        update_stage_record(
            ref,
            "SET checkout_commit = :commit",
            f"({_HOLDS_ATTEMPT}) AND (attribute_not_exists(checkout_commit) OR checkout_commit = :commit)",
            {":commit": commit, ":agent": ref.agent_id, ":attempt": ref.attempt, **LIVE_VALUES},
        )
    except LeaseLost as refused:
        found = refused.item
        held = (found.get("agent_id"), found.get("attempt"), found.get("status")) in {
            (ref.agent_id, ref.attempt, status) for status in LIVE_VALUES.values()
        }
        if held and found.get("checkout_commit"):
            return str(found["checkout_commit"])  # an earlier attempt's: the job's commit
        raise
    return commit


def record_precondition(ref: StageRef, precondition_version: str) -> None:
    """The precondition as it stands once the workspace is the job's (checked out, handoffs
    restored): what a later attempt's reconcile compares with. Fenced on the attempt."""
    update_stage_record(
        ref,
        "SET precondition_version = :pre",
        _HOLDS_ATTEMPT,
        {":pre": precondition_version, ":agent": ref.agent_id, ":attempt": ref.attempt, **LIVE_VALUES},
    )


def finish(
    ref: StageRef,
    status: StageStatus,
    now: datetime,
    exit_code: int | None,
    error_class: str | None,
    receipt: dict[str, Any] | None = None,
    outcome: AttemptOutcome | None = None,
    lease_ended: bool = True,
    claim_id: str | None = None,
    tests: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Record the attempt's outcome, fenced on the attempt (and with `claim_id`, on that very
    claim: the hash of the secret only the claiming agent knows). Returns the record as it was
    before the write (its stage name, who held it). (The job's last successful stage is
    the state machine's to record: at its end, and meanwhile read off the stage records.)

    `outcome` says what is known of the command's effect: a receipt goes with `succeeded` or
    `failed`; a command that was killed (fenced, canceled, shut down) is `unknown`, so the next
    attempt reconciles before it runs anything. `lease_ended`: the command's process group is
    known to be gone, so the lease ends now rather than at its deadline (a successor waits for
    the lease end plus the allowed skew before it probes or runs).

    Sending it again after a lost answer is harmless: a record that already holds this very
    result (this agent, attempt and status) counts as written."""
    values: dict[str, object] = {
        ":status": status.value,
        ":agent": ref.agent_id,
        ":attempt": ref.attempt,
        ":now": now.isoformat(),
        ":writer": f"agent:{ref.agent_id}",
        ":exit": exit_code if exit_code is not None else -1,
        ":error": error_class or "",
        **LIVE_VALUES,
    }
    expression = (
        "SET #status = :status, ended_at = :now, last_writer = :writer, exit_code = :exit, "
        "error_class = :error"
    )
    if lease_ended:
        # The command is over (its group gone): a successor need not wait out the lease.
        lease_epoch, lease_iso = lease_until(now, 0)
        expression += ", lease_expires_at = :lease_end, lease_expires_iso = :lease_end_iso"
        values[":lease_end"], values[":lease_end_iso"] = lease_epoch, lease_iso
    if outcome is None:
        outcome = AttemptOutcome.SUCCEEDED if status.succeeded else AttemptOutcome.FAILED
    expression += ", outcome = :outcome"
    values[":outcome"] = outcome.value
    if receipt is not None:
        expression += ", receipt = :receipt"
        values[":receipt"] = receipt
    if tests is not None:
        # The attempt's ResultsSummary (docs/test-results.md): the last attempt's is the stage's.
        expression += ", tests = :tests"
        values[":tests"] = tests
    expression += " REMOVE held_by"
    condition = _HOLDS_ATTEMPT
    if claim_id is not None:
        condition += " AND claim_id = :claim"
        values[":claim"] = claim_id
    try:
        return update_stage_record(ref, expression, condition, values, return_old=True)
    except LeaseLost as refused:
        found = refused.item
        if (found.get("agent_id"), found.get("attempt"), found.get("status")) != (
            ref.agent_id,
            ref.attempt,
            status.value,
        ) or (claim_id is not None and found.get("claim_id") != claim_id):
            raise
        # Already recorded: this is a repeat of a report whose answer was lost.
        return found
