"""Access pattern: an agent's claim on a stage attempt: taking it (and letting it go when the
state machine never took it), and reading who holds it.

The attempt number is the fencing token (store/stage_attempts). A claim succeeds only when the
stage is unclaimed, was claimed for an earlier attempt, or its holder's lease has run out; every
later write requires the writer to still hold exactly that attempt, so a zombie agent cannot
overwrite its successor.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store.codec import from_attributes
from relevo_core.store.keys import stage_key
from relevo_core.store.stage_attempts import (
    ENDED_STATUSES,
    HOLDS_ATTEMPT,
    LIVE_VALUES,
    LeaseLost,
    StageRef,
    lease_until,
    update_stage_record,
)


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
            and item.get("status") in LIVE_VALUES.values()
            and int(item.get("lease_expires_at", 0)) >= self._now
        )


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
    lease, lease_iso = lease_until(now, lease_ttl_sec)
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
        ":canceled": ENDED_STATUSES[0],
        ":skipped": ENDED_STATUSES[1],
        **LIVE_VALUES,
    }
    # A repeat of this very claim keeps the run token's handing: the state machine handed it to
    # this claim (its agent and attempt) and hands it no second time.
    handed = "" if seen == claim_id else "run_handed_at, "
    unchanged = "attribute_not_exists(claim_id)"
    if seen and seen != claim_id:
        unchanged, values[":seen"] = "claim_id = :seen", seen
    condition = (
        "claim_id = :claim OR (attribute_exists(pk) AND attribute_not_exists(closed_at) AND NOT #status IN "
        "(:canceled, :skipped) AND "
        f"{unchanged} AND (attribute_not_exists(attempt) OR attempt < :attempt OR (attempt = :attempt "
        "AND lease_expires_at < :epoch AND #status IN (:live_running, :live_reconciled))))"
    )
    if dispatch_key is not None:
        condition, values[":dispatch_key"] = f"dispatch_key = :dispatch_key AND ({condition})", dispatch_key
    try:
        update_stage_record(
            ref,
            "SET #status = :running, agent_id = :agent, attempt = :attempt, lease_expires_at = :lease, "
            "lease_expires_iso = :lease_iso, started_at = :now, enqueued_at = :enqueued, last_writer = "
            ":writer, "
            "precondition_version = :pre, held_by = :agent, claim_id = :claim, claimed_over = :over, "
            "journal_id = :journal, transfers = if_not_exists(transfers, :no_transfers), outputs = "
            ":no_outputs "
            f"REMOVE exit_code, error_class, ended_at, {handed}outcome, receipt, handoff_stored, restored, "
            "caches",
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
        return self.status in LIVE_VALUES.values()


def claim_on_record(table: str, job_id: str, stage_index: int, shard: int | None = None) -> ClaimOnRecord:
    item = from_attributes(
        client("dynamodb")
        .get_item(
            TableName=table,
            Key=stage_key(job_id, stage_index, shard),
            ConsistentRead=True,
            ProjectionExpression="agent_id, attempt, claim_id, #status, lease_expires_at, run_handed_at, "
            "stage_name",
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
    lease, lease_iso = lease_until(now, -1)
    try:
        update_stage_record(
            ref,
            "SET lease_expires_at = :lease, lease_expires_iso = :lease_iso, last_writer = :writer REMOVE "
            "held_by",
            HOLDS_ATTEMPT,
            {
                ":agent": ref.agent_id,
                ":attempt": ref.attempt,
                ":lease": lease,
                ":lease_iso": lease_iso,
                ":writer": f"agent:{ref.agent_id}",
                **LIVE_VALUES,
            },
        )
    except LeaseLost:
        return False
    return True


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
    ) in ENDED_STATUSES:
        raise LeaseLost(f"{ref.job_id} stage {ref.stage_index} attempt {ref.attempt}", item)
    return bool(item.get("run_handed_at"))
