"""The claim of a stage attempt, as this agent plays it: journaled first, sent again with the same
secret after a transient error; what to do with the message when the claim does not take. The
answer to the dispatch and the run token are relevo_agent.dispatch's; the wire
relevo_agent.claim_routes'.

    journal.begin ─► claim (route: fenced; returns the envelope, the job's credentials and what
      the previous attempt left) ─► accept (the dispatch token; the route may have answered it)
      ─► beside the stage: the run token looked for, then the claimed message deleted
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from relevo_agent.attempt import StageMessage, utc_now
from relevo_agent.claim_routes import RouteError, RouteUnreachable
from relevo_agent.config import AgentConfig
from relevo_agent.dispatch import DispatchAnswer
from relevo_agent.ending import Ended, Ending
from relevo_agent.job_sessions import JobSessions
from relevo_agent.journal import Journal, Operation, OperationOutcome
from relevo_agent.messages import Message
from relevo_agent.reachability import stack as reachability
from relevo_core.aws import call_budget, own_lane
from relevo_core.fleet.lease_timeline import RETRY_AFTER_FAILURE_SEC, LeaseTimeline
from relevo_core.models.errors import ErrorCode
from relevo_core.store import stage_attempts, stage_claims

if TYPE_CHECKING:
    from relevo_core.models.agent_session import ClaimGranted

log = logging.getLogger(__name__)

# (previous stage's agent, the stage's requires, message, what) -> whether the message was left
# to that agent (relevo_agent.placement).
# (the Macs better placed for the stage, best first; its requires; its message; what, for the log)
PreferPrevious = Callable[[Sequence[str], dict[str, str], Message, str], bool]


def new_claim_secret() -> str:
    """What proves, from the claim on, that this agent made it (journaled, never sent elsewhere)."""
    return secrets.token_hex(32)


class _LeftToPrevious(Exception):
    """The job's next stage was left to the Mac that ran the stage before it."""


class _DispatchEnded(Exception):
    """The dispatch is not this agent's to claim any more (stale, or its job is gone)."""


@dataclass(frozen=True)
class Claimed:
    """A claim that took: the route's answer, the secret it was made with, and its first send
    (the lease counts from there, on this process's monotonic clock). `repeated`: the claim was
    sent more than once (an answer was lost on the way back), so the dispatch may have been
    answered with it already: a token found answered then says nothing (Claims.accept)."""

    granted: ClaimGranted
    claim_secret: str
    sent_at: float
    repeated: bool = False


class Claims(DispatchAnswer):
    """`prefer_previous`: whether a job's next stage is left to the Mac that ran the one before
    (None: no preference). `sessions`: whose claim routes the claims go through. Once a claim took,
    the dispatch is answered as DispatchAnswer does (relevo_agent.dispatch)."""

    def __init__(
        self,
        config: AgentConfig,
        table_name: str,
        journal: Journal,
        sessions: JobSessions,
        prefer_previous: PreferPrevious | None = None,
    ) -> None:
        super().__init__(config, table_name, sessions)
        self.journal = journal
        self.prefer_previous = prefer_previous

    # ------------------------------------------------------------------ the claim
    def take(
        self,
        task: StageMessage,
        message: Message,
        ref: stage_attempts.StageRef,
        timeline: LeaseTimeline,
        workspace: Path,
        op_id: str,
    ) -> Claimed:
        """The claim of `task`'s attempt. Raises Ended when it did not take (abandoned, the message
        seen to; handed back for trouble before the claim took, when the claim may have landed:
        unanswered), the ending the journal keeps once the one conclusion has it.

        A claim of this agent whose answer was lost (journaled UNANSWERED) and which the stage
        record still names (this agent, this journal, its secret's hash, its lease live) is
        resumed: sent again with its own secret, which the record takes as a repeat of it. Nothing
        ran under it (a command starts only once a claim's answer came), so nothing runs twice."""
        earlier = self.journal.get(op_id)
        claim_secret = new_claim_secret()
        try:
            try:
                return self._send_claim(task, message, ref, timeline, workspace, op_id, claim_secret)
            except stage_claims.ClaimRefused as refused:
                own = self._own_unanswered_claim(refused, earlier, ref)
                if own is None:
                    raise
                log.info(
                    "%s attempt %d: the stage record names this agent's own claim, whose answer was lost; "
                    "resumed",
                    op_id,
                    ref.attempt,
                )
                return self._send_claim(task, message, ref, timeline, workspace, op_id, own, resumed=True)
        except stage_claims.ClaimRefused as refused:
            self._refused(op_id, ref, refused, message)
            raise Ended(Ending.abandoned()) from refused
        except _LeftToPrevious as left:
            raise Ended(Ending.abandoned()) from left
        except _DispatchEnded as ended:
            log.warning("%s: %s; its message is deleted", op_id, ended)
            message.delete()
            raise Ended(Ending.abandoned()) from ended
        except (RouteUnreachable, RouteError) as exc:
            # No answer, or the gateway's 5xx: the claim may have landed (UNANSWERED: the next
            # delivery to this agent finds out); a 4xx refused it.
            lost = isinstance(exc, RouteUnreachable) or exc.status >= 500
            raise Ended(Ending.handed_back(f"the claim did not go through ({exc})", unanswered=lost)) from exc

    def _send_claim(
        self,
        task: StageMessage,
        message: Message,
        ref: stage_attempts.StageRef,
        timeline: LeaseTimeline,
        workspace: Path,
        op_id: str,
        claim_secret: str,
        resumed: bool = False,
    ) -> Claimed:
        # Journaled before the claim: every attempt this agent may hold is in its journal, with the
        # secret that gets its job credentials again after a restart.
        self.journal.begin(
            Operation(
                op_id,
                task.job_id,
                task.stage,
                task.stage_index,
                task.attempt,
                str(workspace),
                "",
                claim_secret=claim_secret,
                shard=task.shard,
            )
        )
        sent_at = time.monotonic()
        granted, repeated = self._claim(task, message, ref, timeline, claim_secret, resumed)
        return Claimed(granted, claim_secret, sent_at, repeated or resumed)

    def _own_unanswered_claim(
        self,
        refused: stage_claims.ClaimRefused,
        earlier: Operation | None,
        ref: stage_attempts.StageRef,
    ) -> str | None:
        """The secret of this agent's own claim of this attempt whose answer was lost, when the
        refusal shows the stage record holding exactly it, live; else None."""
        from relevo_core.models.agent_session import claim_id_of

        if (
            earlier is None
            or earlier.outcome is not OperationOutcome.UNANSWERED
            or earlier.attempt != ref.attempt
            or not earlier.claim_secret
            or not refused.held
        ):
            return None
        found = refused.item
        mine = (found.get("agent_id"), found.get("journal_id"), found.get("claim_id")) == (
            self.config.agent_id,
            self.journal.journal_id,
            claim_id_of(earlier.claim_secret),
        )
        return earlier.claim_secret if mine else None

    def _claim(
        self,
        task: StageMessage,
        message: Message,
        ref: stage_attempts.StageRef,
        timeline: LeaseTimeline,
        claim_secret: str,
        resumed: bool = False,
    ) -> tuple[ClaimGranted, bool]:
        """The claim (relevo_agent.claim_routes), sent again with the same secret after a transient
        error (a reset may have lost the answer of a claim that landed), for as long as the lease
        could still be kept afterwards; and whether it was sent more than once. A job's next stage
        is first offered to the Mac that ran the one before (its files are there): the route says
        which, and the message may be left to it. A `resumed` claim holds already: no offer."""
        from relevo_core.models.agent_session import ClaimRequest

        # A stage's shards are not offered to the previous stage's Mac (it would take all it has
        # slots for): they spread over the region (relevo_agent.placement).
        request = ClaimRequest(
            job_id=task.job_id,
            stage_index=task.stage_index,
            shard=task.shard,
            attempt=task.attempt,
            agent_id=self.config.agent_id,
            claim_secret=claim_secret,
            dispatch_key=task.dispatch_key,
            dispatch_token=task.task_token,
            journal_id=self.journal.journal_id,
            enqueued_at=message.sent_at,
            leave_to_previous=not resumed
            and task.attempt == 1
            and task.shard is None
            and self.prefer_previous is not None,
            project=task.project,
            signs=task.signs,
        )
        routes = self.sessions.routes
        if routes is None:
            raise RouteError(
                0,
                None,
                "this agent knows no claim route: its stack file, or api_url in its config, names the "
                "stack's API",
            )
        give_up = time.monotonic() + max(0.0, timeline.fence_after_sec - timeline.renew_interval_sec)
        delay = RETRY_AFTER_FAILURE_SEC
        lost = False  # an earlier send's answer was lost: it may have landed
        while True:
            try:
                # Over connections of its own (own_lane): none another route call holds.
                with call_budget(max(0.5, give_up - time.monotonic())), own_lane("claim"):
                    return routes.claim(request), lost
            except RouteError as refused:
                if refused.code == ErrorCode.CLAIM_REFUSED.value:
                    raise stage_claims.ClaimRefused(
                        str(refused), refused.details, ref.attempt, int(utc_now().timestamp())
                    ) from refused
                if (
                    refused.code == ErrorCode.PREVIOUS_AGENT_PREFERRED.value
                    and self.prefer_previous is not None
                ):
                    # Best first: the previous stage's Mac, then its caches' holders (a route
                    # from before caches names one, as agent_id).
                    named = refused.details.get("agents") or [refused.details.get("agent_id")]
                    preferred = [str(name) for name in named if name]
                    if self.prefer_previous(preferred, task.requires, message, f"{task.job_id}/{task.stage}"):
                        raise _LeftToPrevious(preferred[0]) from refused
                    request = request.model_copy(update={"leave_to_previous": False})
                    continue
                if refused.code in (
                    ErrorCode.JOB_NOT_FOUND.value,
                    ErrorCode.ENVELOPE_VERSION_UNSUPPORTED.value,
                    ErrorCode.DISPATCH_NOT_FOUND.value,
                ):
                    # The route failed the dispatch of a job that is gone or unreadable; one this
                    # region was not handed (or under another key) is not this agent's to run.
                    raise _DispatchEnded(str(refused)) from refused
                raise
            except RouteUnreachable as exc:
                lost = True
                if time.monotonic() + delay > give_up:
                    raise
                if not reachability.failed(exc):
                    log.warning(
                        "%s/%d: claim failed (%s); sending it again", ref.job_id, ref.stage_index, exc
                    )
                time.sleep(delay)
                delay = min(2 * delay, 2.0)

    def _refused(
        self, op_id: str, ref: stage_attempts.StageRef, refused: stage_claims.ClaimRefused, message: Message
    ) -> None:
        found = refused.item
        if refused.held:
            # A redelivery while the holder's lease lives: back when that lease would have ended.
            log.info(
                "%s attempt %d is held by %s; its message returns when that lease would end",
                op_id,
                ref.attempt,
                found.get("agent_id"),
            )
            back_in = int(found.get("lease_expires_at", 0)) - int(utc_now().timestamp()) + 1
            message.give_back_after(min(60, max(1, back_in)))
            return
        log.info(
            "%s attempt %d is over (%s attempt %s, %s): its message is deleted",
            op_id,
            ref.attempt,
            found.get("status"),
            found.get("attempt"),
            found.get("agent_id"),
        )
        message.delete()
