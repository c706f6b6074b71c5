"""The claim of a stage attempt, as this agent plays it: the claim (journaled first, sent again with
the same secret after a transient error), the accept that answers the dispatch's task token, and
the run token the state machine then hands exactly this claim; what to do with the message when
the claim does not take. The wire itself is relevo_agent.claim_routes'.

    journal.begin ─► claim (route: fenced; returns the envelope, the job's credentials and what
      the previous attempt left) ─► accept (the dispatch token; the route may have answered it)
      ─► beside the stage: the run token looked for, then the claimed message deleted
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.attempt import HandBack, StageMessage, StageRun, utc_now
from relevo_agent.claim_routes import RouteError, RouteUnreachable
from relevo_agent.config import AgentConfig
from relevo_agent.job_sessions import JobSessions
from relevo_agent.journal import Journal, Operation, OperationOutcome
from relevo_agent.messages import Message
from relevo_agent.reachability import stack as reachability
from relevo_core.aws import call_budget
from relevo_core.fleet.lease_timeline import RETRY_AFTER_FAILURE_SEC, LeaseTimeline
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import JobStatus
from relevo_core.store import stage_attempts, stage_claims

if TYPE_CHECKING:
    from relevo_core.models.agent_session import ClaimGranted

log = logging.getLogger(__name__)

# How long an accepted claim waits for the state machine's run token before the attempt is given
# up (the execution was stopped, or the stage changed hands, between the claim and the token).
RUN_TOKEN_WAIT_SEC = 30.0
RUN_TOKEN_POLL_SEC = 0.05

# (previous stage's agent, the stage's requires, message, what) -> whether the message was left
# to that agent (relevo_agent.placement).
PreferPrevious = Callable[[str, dict[str, str], Message, str], bool]


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


class Claims:
    """`prefer_previous`: whether a job's next stage is left to the Mac that ran the one before
    (None: no preference). `sessions`: whose claim routes the claims go through."""

    def __init__(
        self,
        config: AgentConfig,
        table_name: str,
        journal: Journal,
        sessions: JobSessions,
        prefer_previous: PreferPrevious | None = None,
    ) -> None:
        self.config = config
        self.table_name = table_name
        self.journal = journal
        self.sessions = sessions
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
    ) -> Claimed | None:
        """The claim of `task`'s attempt; None when it did not take (journaled abandoned, and the
        message seen to). Raises HandBack for trouble before the claim took.

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
                    "%s attempt %d: the stage record names this agent's own claim, whose answer was lost; resumed",
                    op_id,
                    ref.attempt,
                )
                return self._send_claim(task, message, ref, timeline, workspace, op_id, own, resumed=True)
        except stage_claims.ClaimRefused as refused:
            self.journal.record(op_id, ref.attempt, OperationOutcome.ABANDONED, None, None)
            self._refused(op_id, ref, refused, message)
        except _LeftToPrevious:
            self.journal.record(op_id, ref.attempt, OperationOutcome.ABANDONED, None, None)
        except _DispatchEnded as ended:
            self.journal.record(op_id, ref.attempt, OperationOutcome.ABANDONED, None, None)
            log.warning("%s: %s; its message is deleted", op_id, ended)
            message.delete()
        except (RouteUnreachable, RouteError) as exc:
            # No answer, or the gateway's 5xx: the claim may have landed (UNANSWERED: the next
            # delivery to this agent finds out); a 4xx refused it.
            lost = isinstance(exc, RouteUnreachable) or exc.status >= 500
            self.journal.record(
                op_id,
                ref.attempt,
                OperationOutcome.UNANSWERED if lost else OperationOutcome.ABANDONED,
                None,
                None,
            )
            raise HandBack(f"the claim did not go through ({exc})") from exc
        return None

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
                "this agent knows no claim route: its stack file, or api_url in its config, names the stack's API",
            )
        give_up = time.monotonic() + max(0.0, timeline.fence_after_sec - timeline.renew_interval_sec)
        delay = RETRY_AFTER_FAILURE_SEC
        lost = False  # an earlier send's answer was lost: it may have landed
        while True:
            try:
                with call_budget(max(0.5, give_up - time.monotonic())):
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
                    previous_agent = str(refused.details.get("agent_id"))
                    if self.prefer_previous(
                        previous_agent, task.requires, message, f"{task.job_id}/{task.stage}"
                    ):
                        raise _LeftToPrevious(previous_agent) from refused
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

    # ------------------------------------------------------------------ the answer to the dispatch
    def accept(self, run: StageRun, dispatch_token: str, unsure: bool = False) -> bool | None:
        """Tell the state machine who claimed the stage, through the region's accept route (the
        agent holds no task power: the route answers the dispatch for the claim that holds the
        attempt). Once it has taken the answer, its next state hands exactly this claim a run token
        (written only if the claim still holds), so the command may start now: were the execution
        stopped or the stage taken over before the token arrives, the keeper stops the command and
        no result is ever reported for it.

        A transient error is retried for as long as the lease keeps (the keeper renews it
        meanwhile). True: taken. False: the dispatch no longer waits (or the claim no longer
        holds). None: cannot tell (an answer was lost, and a repeat met a token already answered,
        maybe by the first send). `unsure`: the claim itself was sent more than once (Claimed.repeated),
        so the token may have been answered with it before this send."""
        from relevo_core.models.agent_session import AcceptRequest

        ref = run.ref
        routes = self.sessions.routes
        if routes is None or not run.claim_secret:
            return None
        request = AcceptRequest(
            job_id=ref.job_id,
            stage_index=ref.stage_index,
            shard=ref.shard,
            attempt=ref.attempt,
            agent_id=self.config.agent_id,
            claim_secret=run.claim_secret,
            dispatch_token=dispatch_token,
        )
        delay = RETRY_AFTER_FAILURE_SEC
        while run.reason is None:
            try:
                with call_budget(
                    min(5.0, max(0.5, run.lease.fence_in()))
                ):  # one send per try: a repeat is ours to count
                    routes.accept(request)
                return True
            except RouteError as refused:
                if refused.code in (
                    ErrorCode.TASK_GONE.value,
                    ErrorCode.ATTEMPT_ENDED.value,
                    ErrorCode.ATTEMPT_NOT_HELD.value,
                ):
                    if unsure:
                        return None
                    log.warning(
                        "%s/%d: the dispatch is no longer waiting for this claim (%s)",
                        ref.job_id,
                        ref.stage_index,
                        refused.code,
                    )
                    return False
                why = str(refused)
            except RouteUnreachable as exc:
                why = str(exc)
            unsure = True
            log.warning("%s/%d: accept failed (%s); sending it again", ref.job_id, ref.stage_index, why)
            if run.cancel.wait(delay):
                break
            delay = min(2 * delay, 2.0)
        return None

    def heartbeat(self, run: StageRun) -> None:
        """The run's task heartbeat, through the region's heartbeat route (which sends it with the
        run token the agent never sees, for the claim that holds the attempt). RouteError with the
        route's code when refused; RouteUnreachable when no answer came."""
        from relevo_core.models.agent_session import HeartbeatRequest

        ref, routes = run.ref, self.sessions.routes
        if routes is None or not run.claim_secret:
            raise RouteError(0, None, "this agent knows no claim route to heartbeat through")
        routes.heartbeat(
            HeartbeatRequest(
                job_id=ref.job_id,
                stage_index=ref.stage_index,
                shard=ref.shard,
                attempt=ref.attempt,
                agent_id=self.config.agent_id,
                claim_secret=run.claim_secret,
            )
        )

    def taken(self, run: StageRun, op_id: str) -> bool:
        """After an accept whose answer was lost: the state machine took the claim if it hands
        this attempt its run token (the watcher looks)."""
        run.token_known.wait(RUN_TOKEN_WAIT_SEC + 5)
        if run.run_handed and run.reason is None:
            log.info("%s attempt %d: the state machine took the claim after all", op_id, run.ref.attempt)
            return True
        return False

    def let_go(self, run: StageRun, op_id: str) -> None:
        """A claim nothing ran under (the dispatch no longer waited for it), let go once its lease
        is no longer renewed: the next claim of this attempt need not wait out this lease."""
        try:
            if stage_claims.let_go(run.ref, utc_now()):
                log.info(
                    "%s attempt %d: the dispatch no longer waited for this claim; let go of it",
                    op_id,
                    run.ref.attempt,
                )
        except (BotoCoreError, ClientError) as exc:
            log.warning(
                "%s attempt %d: could not let go of a claim nothing ran under (%s); it lapses with its lease",
                op_id,
                run.ref.attempt,
                exc,
            )

    def back_when_lease_ends(self, run: StageRun, op_id: str, message: Message) -> None:
        """Fenced before the state machine was seen to take the claim (the accept's answers were
        lost): the dispatch may still be waiting for one, and only a claim of this same attempt
        can give it. Such a claim is refused until the lease this one took has ended, so the
        message comes back just after that, for this agent or another, instead of after the work
        queue's 60 s visibility timeout. Had the state machine taken the claim after all, the
        next claim's accept meets an answered token and lets the message go (its retry comes
        from the lapsed heartbeat)."""
        back_in = max(1, math.ceil(run.lease.deadline - time.monotonic()) + 1)
        log.info(
            "%s attempt %d: fenced before the claim was taken; its message returns in %ds",
            op_id,
            run.ref.attempt,
            back_in,
        )
        message.give_back_after(back_in)

    # ------------------------------------------------------------------ the run token
    def watch_for_run_token(self, run: StageRun, op_id: str, message: Message) -> None:
        """Beside the stage, from the accepted claim on: look for the run token to be handed (its
        stage record says so; every 50 ms until it is decided), then delete the claimed message;
        both off the path to the command's start, each call bounded by the time left before the fence."""
        lease = run.lease
        started = time.monotonic()
        token_deadline, job_checked = started + RUN_TOKEN_WAIT_SEC, started
        try:
            while not run.done.wait(RUN_TOKEN_POLL_SEC):
                if run.reason is not None:
                    return
                # Slow to come: a job canceled meanwhile never hands one out (checked each second).
                check_job = time.monotonic() - job_checked >= 1.0
                job_checked = time.monotonic() if check_job else job_checked
                with call_budget(min(2.0, max(0.5, lease.fence_in()))):
                    decided = self._look_for_run_token(run, op_id, token_deadline, check_job)
                if decided:
                    run.token_known.set()
                    if run.reason is None:
                        with call_budget(min(5.0, max(0.5, lease.fence_in()))):
                            message.delete()
                    return
        finally:
            run.token_known.set()  # whoever waits for the token is not left waiting

    def _look_for_run_token(self, run: StageRun, op_id: str, deadline: float, check_job: bool) -> bool:
        """One look for the run token the state machine hands the accepted claim. True once it is
        decided: the token was handed (the stage record says when; the token itself stays where no
        job session reads it), or the run was stopped because the stage changed hands, the job
        ended without handing it out, or the deadline passed."""
        ref = run.ref
        try:
            if stage_claims.run_handed(ref):
                run.run_handed = True
                return True
            if check_job and JobStatus(_job_record(self.table_name, ref.job_id)["status"]).terminal:
                log.warning(
                    "%s attempt %d: the job ended before its run token came; stopping", op_id, ref.attempt
                )
                run.stop("canceled")
                return True
        except stage_attempts.LeaseLost as lost:
            if lost.ended:
                log.warning(
                    "%s attempt %d: the stage ended with its job before its run token came; stopping",
                    op_id,
                    ref.attempt,
                )
                run.stop("canceled")
            else:
                log.warning(
                    "%s attempt %d: the stage changed hands before its run token came", op_id, ref.attempt
                )
                run.stop("lease_lost")
            return True
        except RelevoError:  # the job record is gone: deleted once it ended
            run.stop("canceled")
            return True
        except (ClientError, BotoCoreError) as exc:
            log.debug("%s attempt %d: run token read failed (%s)", op_id, ref.attempt, exc)
        if time.monotonic() >= deadline:
            log.warning(
                "%s attempt %d: no run token after %.0fs; stopping the stage",
                op_id,
                ref.attempt,
                RUN_TOKEN_WAIT_SEC,
            )
            run.stop("no_run_token")
            return True
        return False


def _job_record(table: str, job_id: str) -> dict[str, Any]:
    # Only a slow run token needs the job record: an idle agent never loads its store module.
    from relevo_core.store.jobs import get_job_record

    return get_job_record(table, job_id)
