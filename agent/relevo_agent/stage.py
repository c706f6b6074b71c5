"""Running one stage attempt to its conclusion on this agent: the flow, each step in a room of its own.

admission (relevo_agent.admission: a lease it can keep, the signing gate, the workspace reserved)
  ─► claim (relevo_agent.claim: journaled first, fenced; returns what the previous attempt left)
     ─► accept (the dispatch token)
  ─► [beside the stage (relevo_agent.keeper, relevo_agent.claim): lease renewed, task heartbeat,
      run token fetched, message deleted; and the fence: at the lease deadline less the margin
      the command is killed]
  ─► previous outcome unknown? wait until its holder has fenced (its lease end + the allowed
     skew), then reconcile: resend receipt | probe ─► succeeded / manual_review /
     precondition changed (reported, not run) | re-run | resume (its effect_resume runs instead)
  ─► checkout and restore (relevo_agent.prepare)
  ─► execute (relevo_agent.execute: own process group, dead-man supervisor)
  ─► conclude (relevo_agent.conclude: journal.record(outcome, receipt, outbox entry), then the
     report through relevo_agent.outbox: fenced stage write + task token)

Each step returns, or raises Ended (relevo_agent.ending) where the attempt ends there; the
command's step returns the attempt's ending. One place, in `run`, concludes it, once, after every
step, while the lease is still kept; the threads beside the stage stop after it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent import reconcile
from relevo_agent.admission import Admission
from relevo_agent.attempt import HandBack, StageMessage, StageRun
from relevo_agent.claim import Claimed, Claims, PreferPrevious
from relevo_agent.claimed import ClaimedAttempt
from relevo_agent.conclude import Concluder
from relevo_agent.config import AgentConfig
from relevo_agent.ending import Ended, Ending
from relevo_agent.execute import StageCommand
from relevo_agent.job_sessions import AttemptKey, JobSessions
from relevo_agent.journal import Journal, Operation, operation_id
from relevo_agent.keeper import keep
from relevo_agent.keychain import Keychains
from relevo_agent.lease import Lease
from relevo_agent.logs import start_shipper
from relevo_agent.messages import Message
from relevo_agent.outbox import Outbox
from relevo_agent.settle import Settle
from relevo_agent.stage_env import stage_environment
from relevo_agent.stop import AgentStop
from relevo_agent.transfer import ProgressWriter
from relevo_core.aws import call_budget, in_this_context, job_scope
from relevo_core.fleet.lease_timeline import LeaseTimeline
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.admission import Reservation
    from relevo_agent.prepare import Prepared

log = logging.getLogger(__name__)

_claimed_path_loading = threading.Lock()
_claimed_path_loaded = False


def _load_claimed_path() -> None:
    """What only a claimed attempt needs (an idle agent never loads it), loaded once, on a thread
    of its own from the first stage message on: while the claim's round trip is under way, not
    between the claim's answer and the command's start (some 100 ms of imports on a busy Mac)."""
    global _claimed_path_loaded
    with _claimed_path_loading:
        if _claimed_path_loaded:
            return
        _claimed_path_loaded = True
    # The claim's own models first: the stage thread needs them once its journal entry is written.
    from relevo_agent import artifacts, outputs, prepare  # noqa: F401
    from relevo_core.jobs import handoff_sources  # noqa: F401
    from relevo_core.models import agent_session, envelope  # noqa: F401  (loaded, not used here)


class StageRunner:
    """The stages this agent runs, one thread each (`run`). `stop`: the agent's (an error that
    says its stack is gone stops it). `sessions`: the job credentials of the attempts it holds
    (relevo_agent.job_sessions), which its claims are answered with. `prefer_previous`: whether a
    job's next stage is left to the Mac that ran the one before (relevo_agent.placement)."""

    def __init__(
        self,
        config: AgentConfig,
        table_name: str,
        journal: Journal,
        outbox: Outbox,
        stop: AgentStop,
        sessions: JobSessions,
        prefer_previous: PreferPrevious | None = None,
    ) -> None:
        self.config = config
        self.table_name = table_name
        self.journal = journal
        self.sessions = sessions
        self.stop = stop
        self._running: dict[str, StageRun] = {}
        self._running_lock = threading.Lock()
        self.admission = Admission(config, journal)
        self.claims = Claims(config, table_name, journal, sessions, prefer_previous)
        self.concluder = Concluder(journal, outbox)
        # Temporary signing keychains (relevo_agent.keychain).
        self.keychains = Keychains(config)
        self.command = StageCommand(config, journal, self.keychains, sessions.routes)
        self.settle = Settle(config, self.command)

    def stop_all(self, reason: str) -> None:
        """Stop every running stage's command (a shutdown, a fatal exit)."""
        with self._running_lock:
            for run in self._running.values():
                run.stop(reason)

    # ------------------------------------------------------------------ one stage
    def run(self, task: StageMessage, message: Message) -> None:
        """The stage of `task` on this agent, to its conclusion: admitted, claimed, kept, run, reported."""
        op_id = operation_id(task.job_id, task.stage, task.shard)
        if not _claimed_path_loaded:
            threading.Thread(target=_load_claimed_path, name="load", daemon=True).start()
        # What is decided before the claim comes with the message (the envelope comes with the claim).
        timeline = self.admission.timeline(task, op_id)
        ref = stage_attempts.StageRef(
            self.table_name,
            task.job_id,
            task.stage_index,
            task.attempt,
            self.config.agent_id,
            shard=task.shard,
        )
        if op_id in self._running:
            # A second delivery of a message this agent already claimed: the claim decides.
            log.info("%s is already running here; duplicate message dropped", op_id)
            message.delete()
            return
        with self.admission.admitted(task, message, op_id) as reservation:
            if reservation is None:
                return
            local = self.journal.get(op_id)
            run: StageRun | None = None
            with ExitStack() as held:
                try:
                    claimed = self.claims.take(task, message, ref, timeline, reservation.workspace, op_id)
                    attempt = held.enter_context(
                        self._holding(task, message, ref, reservation, local, claimed)
                    )
                    run = attempt.run
                    ending = self._steps(attempt)
                except Ended as ended:
                    ending = ended.ending
                # The one conclusion of the attempt, after every step of it, while its lease is
                # still kept and its job credentials held (then `held` lets them go).
                self.concluder.end(op_id, ref.attempt, run, ending)
        if ending.hand_back is not None:
            raise HandBack(ending.hand_back)

    @contextmanager
    def _holding(
        self,
        task: StageMessage,
        message: Message,
        ref: stage_attempts.StageRef,
        reservation: Reservation,
        local: Operation | None,
        claimed: Claimed,
    ) -> Iterator[ClaimedAttempt]:
        """A claimed attempt, held: its job credentials (everything done for the job from the
        claim on is done with them, on this thread and on those it starts:
        relevo_core.aws.in_this_context), and its lease kept and fenced beside whatever its steps
        do (relevo_agent.keeper). Afterwards: the keepers stopped, a claim nothing ran under let
        go, and the credentials let go unless a report is on its way (the outbox lets them go)."""
        attempt = self._claimed_attempt(task, message, ref, reservation, local, claimed)
        run, op_id = attempt.run, attempt.op_id
        log.info("claimed %s attempt %d", op_id, ref.attempt)
        key = AttemptKey(ref.job_id, ref.stage_index, ref.attempt, ref.shard)
        credentials = self.sessions.granted(key, claimed.claim_secret, claimed.granted.session)
        with ExitStack() as held:
            held.callback(lambda: None if run.reported else self.sessions.release(key))
            held.enter_context(job_scope(credentials))
            held.callback(self._wind_down, attempt)
            with self._running_lock:
                self._running[op_id] = run
            attempt.keepers.extend(keep(run, op_id, self.stop, self.claims.heartbeat))
            yield attempt

    def _claimed_attempt(
        self,
        task: StageMessage,
        message: Message,
        ref: stage_attempts.StageRef,
        reservation: Reservation,
        local: Operation | None,
        claimed: Claimed,
    ) -> ClaimedAttempt:
        # Loaded beside the claim (_load_claimed_path): found at once here.
        from relevo_core.jobs.handoff_sources import JobContext
        from relevo_core.models.envelope import read_envelope

        granted = claimed.granted
        context = JobContext.of(read_envelope(granted.envelope), granted.records)
        reservation.cleanup = context.envelope.workspace_cleanup
        plan = context.envelope.stage(task.stage)
        # The lease as the job's plan has it (its kill grace sets the fence's SIGTERM grace),
        # counted from the claim's first send.
        timeline = LeaseTimeline(
            context.envelope.lease_ttl_sec, plan.kill_grace_sec, self.config.max_clock_skew_sec
        )
        run = StageRun(
            ref,
            Lease(timeline, claimed.sent_at),
            exec_deadline=claimed.sent_at + plan.exec_timeout_sec,
            transfer=ProgressWriter(ref, self.config.progress_interval_sec),
            claim_secret=claimed.claim_secret,
        )
        op_id = operation_id(task.job_id, task.stage, task.shard)
        return ClaimedAttempt(task, message, op_id, reservation.workspace, context, run, local, claimed)

    def _wind_down(self, attempt: ClaimedAttempt) -> None:
        """The threads beside the attempt stopped, once its steps and its conclusion are over."""
        run, op_id = attempt.run, attempt.op_id
        run.close_log()
        run.done.set()
        for keeper in attempt.keepers:
            keeper.join(timeout=5)
        if run.ending is not None and run.ending.let_go:
            # Once the keeper has stopped renewing: the next claim of this attempt (the stage sent
            # again after a pause held its wait) need not wait out this lease.
            self.claims.let_go(run, op_id)
        with self._running_lock:
            self._running.pop(op_id, None)

    def _steps(self, attempt: ClaimedAttempt) -> Ending:
        """Every step of a claimed attempt, in order: each returns, or raises Ended where the
        attempt ends; the command's step returns its ending."""
        run, envelope, plan, workspace = attempt.run, attempt.envelope, attempt.plan, attempt.workspace
        self._answer_dispatch(attempt)
        # Without a checkout the workspace is the job's as it stands: its precondition now
        # (with one, once it is prepared: Prepared.precondition).
        precondition = (
            ""
            if envelope.checkout
            else self._record_precondition(
                run,
                attempt.op_id,
                reconcile.precondition_version(
                    workspace, envelope.ref, attempt.context.commit(), plan.inputs
                ),
                derived=not plan.inputs and not (workspace / ".git").exists(),
            )
        )
        reconciling = stage_attempts.needs_reconcile(attempt.previous, run.ref.attempt)
        if reconciling:
            self._after_previous_fence(attempt)
        # Log shipping (relevo_agent.logs): masked, ordered chunks, never blocking the command,
        # each expiring when the job's envelope says (the stack's log retention). From here
        # on: the checkout and the restore say what they do in the job's log too.
        run.shipper = start_shipper(
            run.ref,
            plan.name,
            self.config,
            stage_environment(os.environ, {}, None),
            envelope.log_expires_at,
            envelope.artifact_uri,
        )
        receipt_decides = reconciling and not reconcile.wants_probe(attempt.local, attempt.previous)
        if receipt_decides:
            # A receipt decides (a success never acknowledged): nothing to prepare or run.
            self.settle.previous(attempt, precondition, {})
        prepared = self._prepare(attempt, journaled=precondition)
        env = self.command.environment(
            envelope, attempt.task, workspace, prepared, attempt.claimed.granted.build_number
        )
        # A decided reconcile ends the attempt there (Ended); a re-run runs the command, a
        # resumption the stage's effect_resume instead.
        resume = (
            self.settle.previous(attempt, prepared.precondition, env)
            if reconciling and not receipt_decides
            else None
        )
        return self.command.execute(
            run, plan, attempt.op_id, workspace, env, envelope, run.shipper, prepared, resume
        )

    def _answer_dispatch(self, attempt: ClaimedAttempt) -> None:
        """The claim route answered the dispatch with the claim (accepted None: it could not tell;
        a claim sent more than once may have answered it before, and the run token decides).
        Returns once the state machine has taken this claim as the dispatch's answer (or may have:
        then the run token it hands out decides), with the message and the run token seen to
        beside the stage (Claims.watch_for_run_token)."""
        run, op_id, message = attempt.run, attempt.op_id, attempt.message
        accepted = attempt.claimed.granted.accepted
        if accepted is None:
            accepted = self.claims.accept(run, attempt.task.task_token, unsure=attempt.claimed.repeated)
        if accepted is False:
            run.stop("not_taken")
            message.delete()
            raise Ended(Ending.abandoned(let_go=True))
        watcher = threading.Thread(
            target=in_this_context(self.claims.watch_for_run_token),
            args=(run, op_id, message),
            name="token",
            daemon=True,
        )
        watcher.start()
        attempt.keepers.append(watcher)
        if accepted is None and not self.claims.taken(run, op_id):
            if run.reason == "fenced":
                self.claims.back_when_lease_ends(run, op_id, message)
            raise Ended(Ending.abandoned())

    def _record_precondition(
        self, run: StageRun, op_id: str, precondition: str, derived: bool = False
    ) -> str:
        """The precondition of a workspace without a checkout, journaled and on the stage record
        (fenced) before anything runs: what a later attempt's reconcile compares with. One that is
        `derived` from the job alone (no repository in the workspace, no inputs: the job's commit)
        is what any later attempt computes too, so the stage record is spared the write."""
        self.journal.set_precondition(op_id, run.ref.attempt, precondition)
        if derived:
            return precondition
        try:
            with call_budget(min(5.0, max(0.5, run.lease.fence_in()))):
                stage_attempts.record_precondition(run.ref, precondition)
        except stage_attempts.LeaseLost:
            run.stop("lease_lost")
        except (BotoCoreError, ClientError) as exc:
            log.warning("%s attempt %d: its precondition was not recorded (%s)", op_id, run.ref.attempt, exc)
        return precondition

    def _prepare(self, attempt: ClaimedAttempt, journaled: str = "") -> Prepared:
        """Checkout and restore (relevo_agent.prepare); Ended when the attempt ended there: it
        failed (with the step's error class) or it was stopped. `journaled`: the precondition the
        journal already holds for this attempt ("" when none)."""
        from relevo_agent.prepare import PrepareFailure, PrepareStopped, prepare

        run, op_id, shipper = attempt.run, attempt.op_id, attempt.run.shipper
        ref = run.ref

        def emit(line: str) -> None:
            line = shipper.masker.mask(line)
            log.info("%s %s", op_id, line)
            shipper.line(line)

        try:
            prepared = prepare(
                self.config,
                attempt.context,
                attempt.plan,
                ref,
                attempt.workspace,
                run.exec_deadline,
                run.cancel,
                emit,
            )
        except PrepareStopped as stopped:
            raise Ended(Ending.stopped_by(run.reason, -1)) from stopped
        except PrepareFailure as failure:
            if run.reason is not None:
                raise Ended(Ending.stopped_by(run.reason, -1)) from failure
            emit(f"[relevo] {failure.error_class.value}: {failure.message}")
            cause = {"prepare": failure.message, "agent_id": self.config.agent_id, "attempt": ref.attempt}
            raise Ended(Ending.failed(failure.error_class, cause)) from failure
        if run.reason is not None:
            raise Ended(Ending.stopped_by(run.reason, -1))
        if attempt.plan.caches and attempt.plan.effect is None:
            from relevo_agent.handoff import Stopped

            try:
                self.command.restore_caches(
                    run, attempt.plan, attempt.envelope, attempt.workspace, prepared, emit
                )
            except Stopped as stopped:
                raise Ended(Ending.stopped_by(run.reason, -1)) from stopped
            if run.reason is not None:
                raise Ended(Ending.stopped_by(run.reason, -1))
        try:
            with call_budget(min(5.0, max(0.5, run.lease.fence_in()))):
                if prepared.restored is not None:
                    stage_attempts.record_restored(ref, prepared.restored)
                if attempt.envelope.checkout is not None or prepared.restored is not None:
                    stage_attempts.record_precondition(ref, prepared.precondition)
        except stage_attempts.LeaseLost as lost:
            raise Ended(Ending.abandoned()) from lost
        except (BotoCoreError, ClientError) as exc:
            log.warning("%s attempt %d: what the restore did was not recorded (%s)", op_id, ref.attempt, exc)
        if (
            prepared.precondition != journaled
        ):  # the same again (nothing checked out or restored) is not written twice
            self.journal.set_precondition(op_id, ref.attempt, prepared.precondition)
        return prepared

    def _after_previous_fence(self, attempt: ClaimedAttempt) -> None:
        """A successor probes (or runs) only once the previous holder has fenced: after that
        holder's recorded lease end plus the allowed clock skew, by this clock. Ended (abandoned)
        if the run was stopped meanwhile."""
        run, previous = attempt.run, attempt.previous
        wait = reconcile.previous_fence_in(previous, self.config.max_clock_skew_sec, time.time())
        if wait <= 0:
            return
        log.info(
            "%s attempt %d: waiting %.1fs for attempt %s's holder to have fenced (its lease end %s plus %gs "
            "of skew)",
            attempt.op_id,
            run.ref.attempt,
            wait,
            previous.get("attempt"),
            previous.get("lease_expires_iso"),
            self.config.max_clock_skew_sec,
        )
        if run.cancel.wait(wait):
            raise Ended(Ending.abandoned())
