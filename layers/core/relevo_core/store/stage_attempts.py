"""Access pattern: an agent's claim on a stage attempt, and every write fenced on that claim.

The attempt number is the fencing token. A claim succeeds only when the stage is unclaimed, was
claimed for an earlier attempt, or its holder's lease has run out; every later write requires the
writer to still hold exactly that attempt, so a zombie agent cannot overwrite its successor.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.models.status import StageStatus
from relevo_core.models.transfer import TransferProgress
from relevo_core.store.codec import from_attributes, to_attribute
from relevo_core.store.keys import HELD_ATTEMPTS_INDEX, stage_key, stages_pk
from relevo_core.store.paging import query_items

# The writer holds the attempt, and the attempt is live: not yet finished, not given up by the
# state machine (dispatched again, failed) and not ended with its job (canceled).
_HOLDS_ATTEMPT = "agent_id = :agent AND attempt = :attempt AND #status IN (:live_running, :live_reconciled)"
# For writes to other items (log chunks, artifact records) fenced on this one in a transaction:
# use holds_attempt_check(ref).
HOLDS_ATTEMPT = _HOLDS_ATTEMPT
_LIVE = {":live_running": StageStatus.RUNNING.value, ":live_reconciled": StageStatus.RECONCILED.value}
# A stage in one of these was ended by its job (or never runs): no attempt may claim it.
_ENDED = (StageStatus.CANCELED.value, StageStatus.SKIPPED.value)


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
            **_LIVE,
        },
    )


@dataclass(frozen=True)
class HeldAttempt:
    """A stage attempt an agent claimed and has not finished (one entry of the held_by index)."""

    job_id: str
    stage_index: int
    stage_name: str
    attempt: int
    # The journal the claim came from (None when it named none).
    journal_id: str | None

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> HeldAttempt:
        return cls(
            job_id=str(item["pk"]).removeprefix(stages_pk("")),
            stage_index=int(item["stage_index"]),
            stage_name=str(item.get("stage_name", "")),
            attempt=int(item["attempt"]),
            journal_id=item.get("journal_id") or None,
        )


def held_by(table: str, agent_id: str) -> list[HeldAttempt]:
    """The stage attempts `agent_id` claimed and never finished (a sparse index: the claim sets
    `held_by`, the fenced finish removes it). What a restarting agent compares with its journal."""
    items = query_items(
        TableName=table,
        IndexName=HELD_ATTEMPTS_INDEX,
        KeyConditionExpression="held_by = :agent",
        # What HeldAttempt reads: a GSI returns only what it projects (template.yaml).
        ProjectionExpression="pk, attempt, journal_id, stage_index, stage_name",
        ExpressionAttributeValues={":agent": {"S": agent_id}},
    )
    return [HeldAttempt.from_item(item) for item in items]


class LeaseLost(Exception):
    """The write was refused: this agent no longer holds the attempt. `item` is the stage record
    as DynamoDB found it (ReturnValuesOnConditionCheckFailure=ALL_OLD), when it said."""

    def __init__(self, message: str, item: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.item = item or {}

    @property
    def ended(self) -> bool:
        """The stage was ended with its job (canceled): not taken over by another attempt."""
        return self.item.get("status") in _ENDED


class ClaimRefused(LeaseLost):
    """A claim was refused: another attempt's holder has the stage, or it is over for this attempt."""

    def __init__(self, message: str, item: dict[str, Any], attempt: int, now_epoch: int) -> None:
        super().__init__(message, item)
        self._attempt = attempt
        self._now = now_epoch

    @property
    def held(self) -> bool:
        """This very attempt is held under a live lease (a redelivery of its message): the message
        is left to come back. Otherwise the message is stale (a later attempt owns the stage, or
        this one finished, or the job ended) and can go."""
        item = self.item
        return (
            item.get("attempt") == self._attempt
            and item.get("status") in _LIVE.values()
            and int(item.get("lease_expires_at", 0)) >= self._now
        )


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
        **{name: to_attribute(value) for name, value in _LIVE.items()},
    }


def holds_attempt_check(ref: StageRef, **values: dict[str, Any]) -> dict[str, Any]:
    """ConditionExpression, names and values of HOLDS_ATTEMPT for a write (or a transaction's
    ConditionCheck) fenced on this attempt; `values` are the write's own expression values."""
    return {
        "ConditionExpression": HOLDS_ATTEMPT,
        "ExpressionAttributeNames": {"#status": "status"},
        "ExpressionAttributeValues": {**holds_attempt_values(ref), **values},
    }


def _update(
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


def _lease_until(now: datetime, lease_ttl_sec: int) -> tuple[int, str]:
    """The lease's end as epoch seconds (for conditions) and as the ISO text the state machine
    compares with its own clock when a task times out."""
    until = now + timedelta(seconds=lease_ttl_sec)
    return int(until.timestamp()), until.astimezone(UTC).isoformat()


def claim(
    ref: StageRef,
    lease_ttl_sec: int,
    now: datetime,
    precondition_version: str | None = None,
    enqueued_at: datetime | None = None,
    claim_id: str | None = None,
    journal_id: str | None = None,
    dispatch_key: str | None = None,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Claim the operation's attempt. Returns what the previous attempt left on the stage record
    before the claim (attempt, agent, outcome, receipt, precondition, lease end, status): what
    reconciliation reads. `enqueued_at` is when the queue accepted the attempt's message (SQS
    SentTimestamp): with `started_at` it shows how long the attempt waited for a Mac.

    A claim reads the record, then writes it on condition that no other claim came in between:
    so the same call can be sent again with the same `claim_id` after a connection reset (it
    cannot tell whether the first one landed) and still return what the previous attempt left.
    It is refused (ClaimRefused) when a live holder has this attempt, a later attempt has the
    stage, this attempt already finished, or the stage is closed: ended with its job (canceled,
    skipped) or the one its job failed on (`closed_at`, set by the state machine and the sweep).

    `dispatch_key`: the claim holds only while the stage record carries this dispatch's key (the
    claim route passes the one its caller's stage message showed). `previous`: the stage record
    as a consistent read just found it, saving the read here."""
    claim_id = claim_id or uuid.uuid4().hex
    if previous is None:
        previous = from_attributes(
            client("dynamodb").get_item(TableName=ref.table, Key=ref.key, ConsistentRead=True).get("Item", {})
        )
    seen = previous.get("claim_id")
    if previous.get("attempt") == ref.attempt:
        # This attempt was claimed before: by this very claim, whose answer was lost (what it
        # read then), or by a claimer whose lease ended before the state machine took its claim
        # (accept lost, fenced or died first). That claimer ran nothing (a command starts only
        # once its claim is taken, and then the dispatch answers no other claim), so this claim
        # takes over what that one had: the attempt before, whose unknown outcome must still be
        # reconciled before anything runs.
        taken_over = previous.get("claimed_over") or {}
    else:
        taken_over = _claimed_over(previous)
    epoch = int(now.timestamp())
    lease, lease_iso = _lease_until(now, lease_ttl_sec)
    values: dict[str, object] = {
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
        ":claim": claim_id,
        ":over": taken_over,
        ":journal": journal_id or "",
        # Each attempt's artifact transfer goes in this map under its attempt number: a nested
        # SET needs its parent map to exist (DynamoDB Developer Guide, "Using update expressions",
        # adding nested map attributes), so the claim makes it, keeping earlier attempts' entries.
        ":no_transfers": {},
        ":no_outputs": {},
        ":canceled": _ENDED[0],
        ":skipped": _ENDED[1],
        **_LIVE,
    }
    # A repeat of this very claim keeps the run token's handing: the state machine handed it to
    # this claim (its agent and attempt) and hands it no second time.
    handed = "" if seen == claim_id else "run_handed_at, "
    unchanged = "attribute_not_exists(claim_id)"
    if seen and seen != claim_id:
        unchanged, values[":seen"] = "claim_id = :seen", seen
    condition = (
        "claim_id = :claim OR (attribute_exists(pk) AND attribute_not_exists(closed_at) AND NOT #status IN (:canceled, :skipped) AND "
        f"{unchanged} AND (attribute_not_exists(attempt) OR attempt < :attempt OR (attempt = :attempt "
        "AND lease_expires_at < :epoch AND #status IN (:live_running, :live_reconciled))))"
    )
    if dispatch_key is not None:
        condition, values[":dispatch_key"] = f"dispatch_key = :dispatch_key AND ({condition})", dispatch_key
    try:
        _update(
            ref,
            "SET #status = :running, agent_id = :agent, attempt = :attempt, lease_expires_at = :lease, "
            "lease_expires_iso = :lease_iso, started_at = :now, enqueued_at = :enqueued, last_writer = :writer, "
            "precondition_version = :pre, held_by = :agent, claim_id = :claim, claimed_over = :over, "
            "journal_id = :journal, transfers = if_not_exists(transfers, :no_transfers), outputs = :no_outputs "
            f"REMOVE exit_code, error_class, ended_at, {handed}outcome, receipt, handoff_stored, restored",
            condition,
            values,
        )
    except LeaseLost as refused:
        raise ClaimRefused(str(refused), refused.item, ref.attempt, epoch) from refused
    return taken_over


# What a claim keeps of the attempt it took over, so a retried claim still knows it: with the
# values it recorded as it ran (`outputs`, for the effect probe) and the handoff it stored.
_CLAIMED_OVER = (
    "attempt",
    "agent_id",
    "outcome",
    "receipt",
    "precondition_version",
    "lease_expires_iso",
    "status",
    "outputs",
    "handoff_stored",
)


def _claimed_over(previous: dict[str, Any]) -> dict[str, Any]:
    return {name: previous[name] for name in _CLAIMED_OVER if name in previous}


@dataclass(frozen=True)
class ClaimOnRecord:
    """Who holds a stage's attempt by its record, and whether it holds anything now: what the
    claim routes check before they renew a session or answer a task for it."""

    agent_id: str | None
    attempt: int | None
    claim_id: str | None
    status: str | None
    # Epoch seconds; 0 when the record has none.
    lease_expires_at: int = 0
    run_handed_at: str | None = None
    stage_name: str = ""

    @property
    def live(self) -> bool:
        """Running (or reconciled, about to run): the attempt has not ended."""
        return self.status in _LIVE.values()


def claim_on_record(table: str, job_id: str, stage_index: int, shard: int | None = None) -> ClaimOnRecord:
    item = from_attributes(
        client("dynamodb")
        .get_item(
            TableName=table,
            Key=stage_key(job_id, stage_index, shard),
            ConsistentRead=True,
            ProjectionExpression="agent_id, attempt, claim_id, #status, lease_expires_at, run_handed_at, stage_name",
            ExpressionAttributeNames={"#status": "status"},
        )
        .get("Item", {})
    )
    attempt, lease = item.get("attempt"), item.get("lease_expires_at")
    return ClaimOnRecord(
        item.get("agent_id"),
        attempt if isinstance(attempt, int) else None,
        item.get("claim_id"),
        item.get("status"),
        int(lease) if isinstance(lease, (int, float)) else 0,
        item.get("run_handed_at"),
        str(item.get("stage_name", "")),
    )


def let_go(ref: StageRef, now: datetime) -> bool:
    """A claim whose dispatch no longer waited (answered by another claim, or its wait ran out
    and the stage was sent again with a new token): the state machine never took it, so nothing
    ran under it, and its lease ends now rather than making the next claim of this attempt wait
    it out. Fenced on the attempt; False if it was no longer this agent's to let go."""
    lease, lease_iso = _lease_until(now, -1)
    try:
        _update(
            ref,
            "SET lease_expires_at = :lease, lease_expires_iso = :lease_iso, last_writer = :writer REMOVE held_by",
            _HOLDS_ATTEMPT,
            {
                ":agent": ref.agent_id,
                ":attempt": ref.attempt,
                ":lease": lease,
                ":lease_iso": lease_iso,
                ":writer": f"agent:{ref.agent_id}",
                **_LIVE,
            },
        )
    except LeaseLost:
        return False
    return True


def renew_lease(
    ref: StageRef, lease_ttl_sec: int, now: datetime, transfer: TransferProgress | None = None
) -> None:
    """Refused (LeaseLost) once the attempt is no longer live: taken over, given up by the state
    machine, or canceled with its job (`LeaseLost.ended`). `transfer`: the attempt's upload
    progress, carried by the same write (no write of its own while the lease is kept)."""
    lease, lease_iso = _lease_until(now, lease_ttl_sec)
    values: dict[str, object] = {
        ":agent": ref.agent_id,
        ":attempt": ref.attempt,
        ":lease": lease,
        ":lease_iso": lease_iso,
        **_LIVE,
    }
    expression = "SET lease_expires_at = :lease, lease_expires_iso = :lease_iso"
    names = None
    if transfer is not None:
        expression += ", transfers.#transfer_attempt = :transfer"
        values[":transfer"] = _transfer_value(ref, transfer)
        names = {"#transfer_attempt": str(ref.attempt)}
    _update(ref, expression, _HOLDS_ATTEMPT, values, names=names)


def record_transfer(ref: StageRef, transfer: TransferProgress) -> None:
    """The attempt's transfer as its upload ended (totals, or how far it got), fenced on the
    attempt: refused (LeaseLost) once another attempt holds the stage."""
    _update(
        ref,
        "SET transfers.#transfer_attempt = :transfer",
        _HOLDS_ATTEMPT,
        {
            ":agent": ref.agent_id,
            ":attempt": ref.attempt,
            ":transfer": _transfer_value(ref, transfer),
            **_LIVE,
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
    _update(
        ref,
        "SET outputs = :outputs",
        _HOLDS_ATTEMPT,
        {":outputs": outputs, ":agent": ref.agent_id, ":attempt": ref.attempt, **_LIVE},
    )


def record_restored(ref: StageRef, restored: dict[str, Any]) -> None:
    """What the attempt's agent restored of the earlier stages' handoffs, fenced on the attempt."""
    _update(
        ref,
        "SET restored = :restored",
        _HOLDS_ATTEMPT,
        {":restored": restored, ":agent": ref.agent_id, ":attempt": ref.attempt, **_LIVE},
    )


def record_checkout_commit(ref: StageRef, commit: str) -> str:
    """The commit the job's ref resolved to at its first checkout, on this stage's record, fenced
    on the attempt; a commit an earlier attempt recorded stays. Returns the commit on record: the
    one every later stage, retry and rerun of the job builds."""
    try:
        _update(
            ref,
            "SET checkout_commit = :commit",
            f"({_HOLDS_ATTEMPT}) AND (attribute_not_exists(checkout_commit) OR checkout_commit = :commit)",
            {":commit": commit, ":agent": ref.agent_id, ":attempt": ref.attempt, **_LIVE},
        )
    except LeaseLost as refused:
        found = refused.item
        held = (found.get("agent_id"), found.get("attempt"), found.get("status")) in {
            (ref.agent_id, ref.attempt, status) for status in _LIVE.values()
        }
        if held and found.get("checkout_commit"):
            return str(found["checkout_commit"])  # an earlier attempt's: the job's commit
        raise
    return commit


def record_precondition(ref: StageRef, precondition_version: str) -> None:
    """The precondition as it stands once the workspace is the job's (checked out, handoffs
    restored): what a later attempt's reconcile compares with. Fenced on the attempt."""
    _update(
        ref,
        "SET precondition_version = :pre",
        _HOLDS_ATTEMPT,
        {":pre": precondition_version, ":agent": ref.agent_id, ":attempt": ref.attempt, **_LIVE},
    )


def run_handed(ref: StageRef) -> bool:
    """Whether the state machine has handed this attempt its run token (AwaitResult, only while
    the claim held): the token itself is in the job's token partition, which no job session reads;
    the stage record says when it was handed (`run_handed_at`)."""
    item = from_attributes(
        client("dynamodb")
        .get_item(
            TableName=ref.table,
            Key=ref.key,
            ConsistentRead=True,
            ProjectionExpression="agent_id, attempt, run_handed_at, #status",
            ExpressionAttributeNames={"#status": "status"},
        )
        .get("Item", {})
    )
    if (item.get("agent_id"), item.get("attempt")) != (ref.agent_id, ref.attempt) or item.get(
        "status"
    ) in _ENDED:
        raise LeaseLost(f"{ref.job_id} stage {ref.stage_index} attempt {ref.attempt}", item)
    return bool(item.get("run_handed_at"))


def finish(
    ref: StageRef,
    status: StageStatus,
    now: datetime,
    exit_code: int | None,
    error_class: str | None,
    receipt: dict[str, Any] | None = None,
    outcome: AttemptOutcome | None = None,
    lease_ended: bool = True,
) -> None:
    """Record the attempt's outcome, fenced on the attempt. (The job's last successful stage is
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
        **_LIVE,
    }
    expression = "SET #status = :status, ended_at = :now, last_writer = :writer, exit_code = :exit, error_class = :error"
    if lease_ended:
        # The command is over (its group gone): a successor need not wait out the lease.
        lease_epoch, lease_iso = _lease_until(now, 0)
        expression += ", lease_expires_at = :lease_end, lease_expires_iso = :lease_end_iso"
        values[":lease_end"], values[":lease_end_iso"] = lease_epoch, lease_iso
    if outcome is None:
        outcome = AttemptOutcome.SUCCEEDED if status.succeeded else AttemptOutcome.FAILED
    expression += ", outcome = :outcome"
    values[":outcome"] = outcome.value
    if receipt is not None:
        expression += ", receipt = :receipt"
        values[":receipt"] = receipt
    expression += " REMOVE held_by"
    try:
        _update(ref, expression, _HOLDS_ATTEMPT, values)
    except LeaseLost as refused:
        found = refused.item
        if (found.get("agent_id"), found.get("attempt"), found.get("status")) != (
            ref.agent_id,
            ref.attempt,
            status.value,
        ):
            raise
        # Already recorded: this is a repeat of a report whose answer was lost.
