"""Running one stage attempt to its conclusion on this agent: the flow, each step in a room of its own.

admission (relevo_agent.admission: a lease it can keep, the signing gate, the workspace reserved)
  ─► claim (relevo_agent.claim: journaled first, fenced; returns what the previous attempt left)
     ─► accept (the dispatch token)
  ─► [beside the stage (relevo_agent.keeper, relevo_agent.claim): lease renewed, task heartbeat,
      run token fetched, message deleted; and the fence: at the lease deadline less the margin
      the command is killed]
  ─► previous outcome unknown? wait until its holder has fenced (its lease end + the allowed
     skew), then reconcile: resend receipt | probe ─► succeeded / manual_review /
     precondition changed (reported, not run) | re-run
  ─► checkout and restore (relevo_agent.prepare)
  ─► execute (relevo_agent.execute: own process group, dead-man supervisor)
  ─► conclude (relevo_agent.conclude: journal.record(outcome, receipt, outbox entry), then the
     report through relevo_agent.outbox: fenced stage write + task token)
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent import reconcile
from relevo_agent.admission import Admission
from relevo_agent.attempt import StageMessage, StageRun, utc_now
from relevo_agent.claim import Claims, PreferPrevious
from relevo_agent.conclude import Concluder
from relevo_agent.config import AgentConfig
from relevo_agent.execute import StageCommand
from relevo_agent.executor import TAIL_BYTES
from relevo_agent.job_sessions import AttemptKey, JobSessions
from relevo_agent.journal import Journal, Operation, OperationOutcome, operation_id
from relevo_agent.keeper import keep
from relevo_agent.keychain import Keychains
from relevo_agent.lease import Lease
from relevo_agent.logs import Masker, secret_values, start_shipper
from relevo_agent.messages import Message
from relevo_agent.outbox import Outbox
from relevo_agent.stage_env import stage_environment
from relevo_agent.stop import AgentStop
from relevo_agent.transfer import ProgressWriter
from relevo_core.aws import call_budget, in_this_context, job_scope
from relevo_core.fleet.lease_timeline import LeaseTimeline
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.prepare import Prepared
    from relevo_core.jobs.handoff_sources import JobContext
    from relevo_core.models.plan import StagePlan

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
    job's next stage is left to the Mac that ran the one before (relevo_agent.presence)."""

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
        self.command = StageCommand(config, journal, self.keychains, self.concluder)

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
            claimed = self.claims.take(task, message, ref, timeline, reservation.workspace, op_id)
            if claimed is None:
                return
            log.info("claimed %s attempt %d", op_id, ref.attempt)
            key = AttemptKey(ref.job_id, ref.stage_index, ref.attempt, ref.shard)
            granted = claimed.granted
            credentials = self.sessions.granted(key, claimed.claim_secret, granted.session)
            # Loaded beside the claim (_load_claimed_path): found at once here.
            from relevo_core.jobs.handoff_sources import JobContext
            from relevo_core.models.envelope import read_envelope

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
            try:
                # From the claim on, everything done for the job is done with its credentials, on
                # this thread and on those it starts (relevo_core.aws.in_this_context).
                with job_scope(credentials):
                    self._claimed(
                        reservation.workspace,
                        context,
                        task,
                        message,
                        run,
                        op_id,
                        local,
                        granted.previous,
                        granted.accepted,
                        claimed.repeated,
                    )
            finally:
                if not run.reported:
                    self.sessions.release(key)

    def _claimed(
        self,
        workspace: Path,
        context: JobContext,
        task: StageMessage,
        message: Message,
        run: StageRun,
        op_id: str,
        local: Operation | None,
        previous: dict[str, Any],
        granted_accepted: bool | None,
        repeated: bool = False,
    ) -> None:
        envelope = context.envelope
        plan = envelope.stage(task.stage)
        ref = run.ref
        # From the claim on, the lease is kept and fenced beside whatever this thread does: the
        # answer to the dispatch, the wait for the previous holder, the checkout and restore, the
        # probe, the command, the handoff.
        with self._running_lock:
            self._running[op_id] = run
        keepers = keep(run, op_id, self.stop, self.claims.heartbeat)
        refused = False
        try:
            # The claim route answered the dispatch with the claim (None: it could not tell; a
            # claim sent more than once may have answered it before, and the run token decides).
            accepted = (
                granted_accepted
                if granted_accepted is not None
                else self.claims.accept(run, task.task_token, unsure=repeated)
            )
            if accepted is False:
                run.stop("not_taken")
                refused = True
                message.delete()
                self.concluder.abandon(run, op_id)
                return
            # The state machine has taken this claim as the dispatch's answer (or may have: then
            # the run token it hands out decides): the stage starts now. The message and the run
            # token are seen to beside it (Claims.watch_for_run_token).
            watcher = threading.Thread(
                target=in_this_context(self.claims.watch_for_run_token),
                args=(run, op_id, message),
                name="token",
                daemon=True,
            )
            watcher.start()
            keepers.append(watcher)
            if accepted is None and not self.claims.taken(run, op_id):
                self.concluder.abandon(run, op_id)
                if run.reason == "fenced":
                    self.claims.back_when_lease_ends(run, op_id, message)
                return
            # Without a checkout the workspace is the job's as it stands: its precondition now
            # (with one, once it is prepared: Prepared.precondition).
            precondition = (
                ""
                if envelope.checkout
                else self._record_precondition(
                    run,
                    op_id,
                    reconcile.precondition_version(workspace, envelope.ref, context.commit(), plan.inputs),
                    derived=not plan.inputs and not (workspace / ".git").exists(),
                )
            )
            reconciling = stage_attempts.needs_reconcile(previous, ref.attempt)
            if reconciling and not self._after_previous_fence(run, op_id, previous):
                self.concluder.abandon(run, op_id)
                return
            # Log shipping (relevo_agent.logs): masked, ordered chunks, never blocking the command,
            # each expiring when the job's envelope says (the stack's log retention). From here
            # on: the checkout and the restore say what they do in the job's log too.
            shipper = start_shipper(
                ref,
                plan.name,
                self.config,
                stage_environment(os.environ, {}, None),
                envelope.log_expires_at,
                envelope.artifact_uri,
            )
            run.shipper = shipper
            try:
                if reconciling and not reconcile.wants_probe(local, previous):
                    # A receipt decides (a success never acknowledged): nothing to prepare or run.
                    self._reconcile(run, plan, op_id, local, previous, precondition, workspace, {})
                    return
                prepared = self._prepare(
                    run, context, plan, op_id, workspace, shipper, journaled=precondition
                )
                if prepared is None:
                    return
                env = self.command.environment(envelope, task, workspace, prepared)
                if reconciling and not self._reconcile(
                    run, plan, op_id, local, previous, prepared.precondition, workspace, env
                ):
                    return
                self.command.execute(run, plan, op_id, workspace, env, envelope, shipper, prepared)
            finally:
                run.close_log()
        finally:
            run.done.set()
            for keeper in keepers:
                keeper.join(timeout=5)
            if refused:
                # Once the keeper has stopped renewing: the next claim of this attempt (the
                # stage sent again after a pause held its wait) need not wait out this lease.
                self.claims.let_go(run, op_id)
            with self._running_lock:
                self._running.pop(op_id, None)

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

    def _prepare(
        self,
        run: StageRun,
        context: JobContext,
        plan: StagePlan,
        op_id: str,
        workspace: Path,
        shipper: Any,
        journaled: str = "",
    ) -> Prepared | None:
        """Checkout and restore (relevo_agent.prepare). None when the attempt ended there: it failed
        (concluded with the step's error class) or it was stopped. `journaled`: the precondition
        the journal already holds for this attempt ("" when none)."""
        from relevo_agent.prepare import PrepareFailure, PrepareStopped, prepare

        ref = run.ref

        def emit(line: str) -> None:
            line = shipper.masker.mask(line)
            log.info("%s %s", op_id, line)
            shipper.line(line)

        try:
            prepared = prepare(
                self.config, context, plan, ref, workspace, run.exec_deadline, run.cancel, emit
            )
        except PrepareStopped:
            self.concluder.stopped(run, op_id, -1)
            return None
        except PrepareFailure as failure:
            if run.reason is not None:
                self.concluder.stopped(run, op_id, -1)
                return None
            emit(f"[relevo] {failure.error_class.value}: {failure.message}")
            cause = {"prepare": failure.message, "agent_id": self.config.agent_id, "attempt": ref.attempt}
            self.concluder.conclude(
                run,
                op_id,
                StageStatus.FAILED,
                OperationOutcome.FAILED,
                None,
                error=failure.error_class,
                cause=json.dumps(cause),
            )
            return None
        if run.reason is not None:
            self.concluder.stopped(run, op_id, -1)
            return None
        try:
            with call_budget(min(5.0, max(0.5, run.lease.fence_in()))):
                if prepared.restored is not None:
                    stage_attempts.record_restored(ref, prepared.restored)
                if context.envelope.checkout is not None or prepared.restored is not None:
                    stage_attempts.record_precondition(ref, prepared.precondition)
        except stage_attempts.LeaseLost:
            self.concluder.abandon(run, op_id)
            return None
        except (BotoCoreError, ClientError) as exc:
            log.warning("%s attempt %d: what the restore did was not recorded (%s)", op_id, ref.attempt, exc)
        if (
            prepared.precondition != journaled
        ):  # the same again (nothing checked out or restored) is not written twice
            self.journal.set_precondition(op_id, ref.attempt, prepared.precondition)
        return prepared

    # ------------------------------------------------------------------ reconcile
    def _after_previous_fence(self, run: StageRun, op_id: str, previous: dict[str, Any]) -> bool:
        """A successor probes (or runs) only once the previous holder has fenced: after that
        holder's recorded lease end plus the allowed clock skew, by this clock. False if the run
        was stopped meanwhile."""
        wait = reconcile.previous_fence_in(previous, self.config.max_clock_skew_sec, time.time())
        if wait <= 0:
            return True
        log.info(
            "%s attempt %d: waiting %.1fs for attempt %s's holder to have fenced (its lease end %s plus %gs of skew)",
            op_id,
            run.ref.attempt,
            wait,
            previous.get("attempt"),
            previous.get("lease_expires_iso"),
            self.config.max_clock_skew_sec,
        )
        return not run.cancel.wait(wait)

    def _reconcile(
        self,
        run: StageRun,
        plan: StagePlan,
        op_id: str,
        local: Operation | None,
        previous: dict[str, Any],
        precondition: str,
        workspace: Path,
        env: dict[str, str],
    ) -> bool:
        """Decide the previous attempt's unknown outcome. True: run the stage; False: decided."""
        ref = run.ref
        probe = None
        previous_outputs = reconcile.previous_outputs(local, previous)
        if plan.effect_probe and reconcile.wants_probe(local, previous):
            # The probe asks about what the previous attempt recorded (a submission id, say).
            from relevo_core.models.handoff import previous_output_variable

            probe_env = {
                **env,
                "RELEVO_PROBE": "1",
                **{previous_output_variable(k): v for k, v in previous_outputs.items()},
            }
            result = self.command.under_lease(
                run, plan, plan.effect_probe, workspace, probe_env, lambda chunk: None, probe=True
            )
            if run.reason is not None:
                self.concluder.stopped(run, op_id, result.exit_code)
                return False
            # Masked like the stage's logs before any of it is recorded or logged.
            probe = reconcile.ProbeResult.masked(
                -1 if result.timed_out else result.exit_code,
                result.output_tail,
                Masker(secret_values(self.config.mask, env)),
                cut=len(result.output_tail.encode()) >= TAIL_BYTES,
            )
        reconciled = reconcile.decide(op_id, local, previous, precondition, probe)
        if reconciled.action is reconcile.ReconcileAction.SUCCEEDED:
            reconciled = reconcile.with_what_it_left(reconciled, plan.handoff, previous, previous_outputs)
        log.info(
            "%s attempt %d reconciled: %s %s",
            op_id,
            ref.attempt,
            reconciled.action.value,
            reconciled.evidence,
        )
        try:
            stage_attempts.record_reconciled(ref, reconciled.action.value, reconciled.evidence, utc_now())
        except stage_attempts.LeaseLost:
            self.concluder.abandon(run, op_id)
            return False
        if reconciled.action is reconcile.ReconcileAction.RERUN:
            return True
        if reconciled.action in (reconcile.ReconcileAction.RESEND, reconcile.ReconcileAction.SUCCEEDED):
            self.concluder.conclude(
                run,
                op_id,
                StageStatus.SUCCEEDED,
                OperationOutcome.RECONCILED,
                reconciled.receipt,
                exit_code=0,
            )
        elif reconciled.action is reconcile.ReconcileAction.MANUAL_REVIEW:
            self.concluder.conclude(
                run,
                op_id,
                StageStatus.MANUAL_REVIEW,
                OperationOutcome.RECONCILED,
                None,
                error=ErrorClass.MANUAL_REVIEW,
                cause=json.dumps(reconciled.evidence),
                stage_outcome=stage_attempts.AttemptOutcome.MANUAL_REVIEW,
            )
        else:
            self.concluder.conclude(
                run,
                op_id,
                StageStatus.FAILED,
                OperationOutcome.RECONCILED,
                None,
                error=ErrorClass.PRECONDITION_CHANGED,
                cause=json.dumps(reconciled.evidence),
            )
        return False
