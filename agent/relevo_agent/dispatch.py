"""The answer to a stage's dispatch once its claim took, as this agent plays it: the accept that
answers the dispatch's task token (the claim route may have answered it already), the run token
the state machine then hands exactly this claim, looked for beside the stage (then the claimed
message deleted), the task heartbeat, and what becomes of a claim the dispatch no longer waits for.
The claim itself is relevo_agent.claim's; the wire relevo_agent.claim_routes'.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.attempt import StageRun, utc_now
from relevo_agent.claim_routes import RouteError, RouteUnreachable
from relevo_agent.config import AgentConfig
from relevo_agent.job_sessions import JobSessions
from relevo_agent.messages import Message
from relevo_core.aws import call_budget
from relevo_core.fleet.lease_timeline import RETRY_AFTER_FAILURE_SEC
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import JobStatus
from relevo_core.store import stage_attempts, stage_claims

log = logging.getLogger(__name__)

# How long an accepted claim waits for the state machine's run token before the attempt is given
# up (the execution was stopped, or the stage changed hands, between the claim and the token).
RUN_TOKEN_WAIT_SEC = 30.0
RUN_TOKEN_POLL_SEC = 0.05


class DispatchAnswer:
    """`sessions`: whose claim routes the accept and the heartbeats go through; `table_name`: the
    stack's table, where the stage record says whether the run token was handed."""

    def __init__(self, config: AgentConfig, table_name: str, sessions: JobSessions) -> None:
        self.config = config
        self.table_name = table_name
        self.sessions = sessions

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
