"""Running one stage attempt to its conclusion on this agent.

    journal.begin ─► claim (fenced; returns what the previous attempt left) ─► accept (dispatch token)
      ─► [beside the stage: message deleted, run token fetched, lease renewed, task heartbeat,
          and the fence: at the lease deadline less the margin the command is killed]
      ─► previous outcome unknown? wait until its holder has fenced (its lease end + the allowed
         skew), then reconcile: resend receipt | probe ─► succeeded / manual_review /
         precondition changed (reported, not run) | re-run
      ─► run (own process group, dead-man supervisor) ─► journal.record(outcome, receipt, outbox entry)
      ─► report (relevo_agent.outbox: fenced stage write + task token) ─► outbox entry removed

The lease keeper and the fence are relevo_agent.lease's; the records the threads of one attempt
share are relevo_agent.attempt's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent import reconcile
from relevo_agent.attempt import DEAD_TOKEN, StageMessage, StageReport, StageRun, utc_now
from relevo_agent.claims import RouteError, RouteUnreachable, new_claim_secret
from relevo_agent.classify import classify
from relevo_agent.config import AgentConfig
from relevo_agent.executor import TAIL_BYTES, ExecResult, run_command
from relevo_agent.hygiene import Hygiene
from relevo_agent.job_sessions import JobSessions
from relevo_agent.journal import Journal, Operation, OperationOutcome, operation_id
from relevo_agent.keychain import KeychainFailure, Keychains, read_identities
from relevo_agent.lease import Lease, keep_fence, keep_lease
from relevo_agent.logs import Masker, secret_values, start_shipper
from relevo_agent.messages import Message
from relevo_agent.outbox import Outbox
from relevo_agent.stage_env import stage_environment
from relevo_agent.transfer import ProgressWriter
from relevo_agent import warning_lines
from relevo_agent.reachability import stack as reachability
from relevo_agent.warning_lines import WarningLines
from relevo_core.aws import call_budget, client, in_this_context, job_scope
from relevo_core.lease_timeline import RETRY_AFTER_FAILURE_SEC, LeaseTimeline
from relevo_core.models.errors import ErrorClass, ErrorCode, RelevoError
from relevo_core.models.status import JobStatus, StageStatus
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.prepare import Prepared
    from relevo_core.jobs.handoff_sources import JobContext
    from relevo_core.models.agent_session import ClaimGranted
    from relevo_core.models.envelope import JobEnvelope
    from relevo_core.models.plan import StagePlan

log = logging.getLogger(__name__)

# How long an accepted claim waits for the state machine's run token before the attempt is given
# up (the execution was stopped, or the stage changed hands, between the claim and the token).
RUN_TOKEN_WAIT_SEC = 30.0
RUN_TOKEN_POLL_SEC = 0.05


class _LeftToPrevious(Exception):
    """The job's next stage was left to the Mac that ran the stage before it."""


class _DispatchEnded(Exception):
    """The dispatch is not this agent's to claim any more (stale, or its job is gone)."""


class HandBack(Exception):
    """Trouble before the claim took (a connection reset, a timeout): the message goes straight
    back to the queue (visibility 0) for this agent or another to take, never waits out its
    visibility timeout."""


class StageRunner:
    """The stages this agent runs, one thread each (`run`). `stack_gone`: whether an error says
    the stack no longer exists (the agent then exits). `sessions`: the job credentials of the
    attempts it holds (relevo_agent.job_sessions), which its claims are answered with."""

    def __init__(
        self,
        config: AgentConfig,
        table_name: str,
        journal: Journal,
        outbox: Outbox,
        stack_gone: Callable[[BaseException], bool],
        sessions: JobSessions,
    ) -> None:
        self.config = config
        self.table_name = table_name
        self.journal = journal
        self.outbox = outbox
        self.sessions = sessions
        self._stack_gone = stack_gone
        self._running: dict[str, StageRun] = {}
        self._running_lock = threading.Lock()
        # The workspace of each stage thread from before its claim to its end (retention keeps them).
        self._workspaces: dict[str, Path] = {}
        self.hygiene = Hygiene(config, journal, self._workspaces_in_use)
        # (previous stage's agent, the stage's requires, message, what) -> whether the message was
        # left to that agent (relevo_agent.presence); None: no preference.
        self.prefer_previous: Callable[[str, dict[str, str], Message, str], bool] | None = None
        # Temporary signing keychains (relevo_agent.keychain); the stages that hold one.
        self.keychains = Keychains(config)
        self._signing: set[str] = set()

    def _workspaces_in_use(self) -> set[Path]:
        with self._running_lock:
            return set(self._workspaces.values())

    def stop_all(self, reason: str) -> None:
        """Stop every running stage's command (a shutdown, a fatal exit)."""
        with self._running_lock:
            for run in self._running.values():
                run.stop(reason)

    # ------------------------------------------------------------------ one stage
    def run(self, task: StageMessage, message: Message) -> None:
        """The stage of `task` on this agent, to its conclusion: claimed, kept, run, reported."""
        op_id = operation_id(task.job_id, task.stage)
        # What is decided before the claim comes with the message (the envelope comes with the
        # claim). Whether a renewal fits before the fence depends on the lease and the allowed
        # skew only (a kill grace the lease has no room for is cut short: relevo_core.lease_timeline).
        timeline = LeaseTimeline(task.lease_ttl_sec, 0, self.config.max_clock_skew_sec)
        if not timeline.feasible:
            log.error(
                "%s: a lease of %ds leaves no renewal before the fence with max_clock_skew_sec %g; "
                "not taking it (raise the project's lease_ttl_sec)", op_id, task.lease_ttl_sec, self.config.max_clock_skew_sec,
            )
            raise HandBack("the lease is too short for this agent")
        ref = stage_attempts.StageRef(self.table_name, task.job_id, task.stage_index, task.attempt, self.config.agent_id)
        if op_id in self._running:
            # A second delivery of a message this agent already claimed: the claim decides.
            log.info("%s is already running here; duplicate message dropped", op_id)
            message.delete()
            return
        workspace = self.config.workspace_root / task.project
        signing = task.signs
        with self._running_lock:
            # The signing gate: a keychain goes on the user's search list, which every process of
            # the user searches, so a stage with one runs alone on this agent.
            busy = bool(self._workspaces) if signing else bool(self._signing)
            if not busy:
                self._workspaces[op_id] = workspace
                if signing:
                    self._signing.add(op_id)
        if busy:
            log.info("%s: %s; its message returns in %ds", op_id,
                     "a signing stage runs alone and others run here" if signing else "a signing stage runs here alone",
                     self.config.handoff_delay_sec)
            # A fresh copy (Message.resend): however often it waits here, never the redrive DLQ.
            try:
                message.resend(max(1, self.config.handoff_delay_sec))
            except (BotoCoreError, ClientError):
                message.give_back_after(max(1, self.config.handoff_delay_sec))
            return
        # The project's workspace_cleanup, once the claim brought its envelope.
        cleanup: list[str | None] = [None]
        try:
            self.hygiene.used(workspace)
            # Held for the whole stage: no agent process of this machine removes the workspace under it.
            with self.hygiene.locks.using(workspace):
                self._run_in(workspace, task, message, timeline, op_id, ref, cleanup)
        finally:
            with self._running_lock:
                self._workspaces.pop(op_id, None)
                self._signing.discard(op_id)
            self.hygiene.stage_ended(task.project, workspace, cleanup[0])

    def _run_in(
        self, workspace: Path, task: StageMessage, message: Message, timeline: LeaseTimeline, op_id: str,
        ref: stage_attempts.StageRef, cleanup: list[str | None],
    ) -> None:
        local = self.journal.get(op_id)
        claim_secret = new_claim_secret()
        # Journaled before the claim: every attempt this agent may hold is in its journal, with the
        # secret that gets its job credentials again after a restart.
        self.journal.begin(Operation(op_id, task.job_id, task.stage, task.stage_index, task.attempt, str(workspace), "", claim_secret=claim_secret))
        claim_sent = time.monotonic()
        try:
            granted = self._claim(task, message, ref, timeline, claim_secret)
        except stage_attempts.ClaimRefused as refused:
            self.journal.record(op_id, ref.attempt, OperationOutcome.ABANDONED, None, None)
            self._refused(op_id, ref, refused, message)
            return
        except _LeftToPrevious:
            self.journal.record(op_id, ref.attempt, OperationOutcome.ABANDONED, None, None)
            return
        except _DispatchEnded as ended:
            self.journal.record(op_id, ref.attempt, OperationOutcome.ABANDONED, None, None)
            log.warning("%s: %s; its message is deleted", op_id, ended)
            message.delete()
            return
        except (RouteUnreachable, RouteError) as exc:
            self.journal.record(op_id, ref.attempt, OperationOutcome.ABANDONED, None, None)
            raise HandBack(f"the claim did not go through ({exc})") from exc
        log.info("claimed %s attempt %d", op_id, ref.attempt)
        key = (ref.job_id, ref.stage_index, ref.attempt)
        credentials = self.sessions.granted(key, claim_secret, granted.session)
        # What only a claimed attempt needs is imported here: an idle agent never loads it.
        from relevo_core.jobs.handoff_sources import JobContext
        from relevo_core.models.envelope import read_envelope

        context = JobContext(read_envelope(granted.envelope), {str(r.get("stage_name")): r for r in granted.records if r.get("stage_name")})
        cleanup[0] = context.envelope.workspace_cleanup
        plan = context.envelope.stage(task.stage)
        # The lease as the job's plan has it (its kill grace sets the fence's SIGTERM grace),
        # counted from the claim's first send.
        timeline = LeaseTimeline(context.envelope.lease_ttl_sec, plan.kill_grace_sec, self.config.max_clock_skew_sec)
        run = StageRun(ref, Lease(timeline, claim_sent), exec_deadline=claim_sent + plan.exec_timeout_sec,
                       transfer=ProgressWriter(ref, self.config.progress_interval_sec), claim_secret=claim_secret)
        try:
            # From the claim on, everything done for the job is done with its credentials, on this
            # thread and on those it starts (relevo_core.aws.in_this_context).
            with job_scope(credentials):
                self._claimed(workspace, context, task, message, run, op_id, local, granted.previous, granted.accepted)
        finally:
            if not run.reported:
                self.sessions.release(key)

    def _claimed(
        self, workspace: Path, context: JobContext, task: StageMessage, message: Message, run: StageRun, op_id: str,
        local: Operation | None, previous: dict[str, Any], granted_accepted: bool | None,
    ) -> None:
        envelope = context.envelope
        plan = envelope.stage(task.stage)
        ref = run.ref
        # From the claim on, the lease is kept and fenced beside whatever this thread does: the
        # answer to the dispatch, the wait for the previous holder, the checkout and restore, the
        # probe, the command, the handoff.
        with self._running_lock:
            self._running[op_id] = run
        keepers = [
            threading.Thread(target=in_this_context(keep_lease), args=(run, op_id, self._stack_gone), name="lease", daemon=True),
            threading.Thread(target=in_this_context(keep_fence), args=(run, op_id), name="fence", daemon=True),
        ]
        for keeper in keepers:
            keeper.start()
        refused = False
        try:
            # The claim route answered the dispatch with the claim (None: it could not tell).
            accepted = granted_accepted if granted_accepted is not None else self._accept(run, task.task_token)
            if accepted is False:
                run.stop("not_taken")
                refused = True
                message.delete()
                self._abandon(run, op_id)
                return
            # The state machine has taken this claim as the dispatch's answer (or may have: then
            # the run token it hands out decides): the stage starts now. The message and the run
            # token are seen to beside it (_watch_for_run_token).
            watcher = threading.Thread(target=in_this_context(self._watch_for_run_token), args=(run, op_id, message), name="token", daemon=True)
            watcher.start()
            keepers.append(watcher)
            if accepted is None and not self._taken(run, op_id):
                self._abandon(run, op_id)
                if run.reason == "fenced":
                    self._back_when_lease_ends(run, op_id, message)
                return
            # Without a checkout the workspace is the job's as it stands: its precondition now
            # (with one, once it is prepared: Prepared.precondition).
            precondition = "" if envelope.checkout else self._record_precondition(
                run, op_id, reconcile.precondition_version(workspace, envelope.ref, context.commit(), plan.inputs),
                derived=not plan.inputs and not (workspace / ".git").exists(),
            )
            reconciling = stage_attempts.needs_reconcile(previous, ref.attempt)
            if reconciling and not self._after_previous_fence(run, op_id, previous):
                self._abandon(run, op_id)
                return
            # Log shipping (relevo_agent.logs): masked, ordered chunks, never blocking the command,
            # each expiring when the job's envelope says (the stack's log retention). From here
            # on: the checkout and the restore say what they do in the job's log too.
            shipper = start_shipper(
                ref, plan.name, self.config, stage_environment(os.environ, {}, None), envelope.log_expires_at, envelope.artifact_uri,
            )
            run.shipper = shipper
            try:
                if reconciling and not reconcile.wants_probe(local, previous):
                    # A receipt decides (a success never acknowledged): nothing to prepare or run.
                    self._reconcile(run, plan, op_id, local, previous, precondition, workspace, {}, None)
                    return
                prepared = self._prepare(run, context, plan, op_id, workspace, shipper)
                if prepared is None:
                    return
                env = self._stage_env(envelope, task, workspace, prepared)
                if reconciling and not self._reconcile(run, plan, op_id, local, previous, prepared.precondition, workspace, env, prepared):
                    return
                self._execute(run, plan, op_id, workspace, env, envelope, shipper, prepared)
            finally:
                run.close_log()
        finally:
            run.done.set()
            for keeper in keepers:
                keeper.join(timeout=5)
            if refused:
                # Once the keeper has stopped renewing: the next claim of this attempt (the
                # stage sent again after a pause held its wait) need not wait out this lease.
                self._let_go(run, op_id)
            with self._running_lock:
                self._running.pop(op_id, None)

    def _record_precondition(self, run: StageRun, op_id: str, precondition: str, derived: bool = False) -> str:
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
        self, run: StageRun, context: JobContext, plan: StagePlan, op_id: str, workspace: Path, shipper: Any
    ) -> Prepared | None:
        from relevo_agent.prepare import PrepareFailure, PrepareStopped, prepare

        """Checkout and restore (relevo_agent.prepare). None when the attempt ended there: it failed
        (concluded with the step's error class) or it was stopped."""
        ref = run.ref

        def emit(line: str) -> None:
            line = shipper.masker.mask(line)
            log.info("%s %s", op_id, line)
            shipper.line(line)

        try:
            prepared = prepare(self.config, context, plan, ref, workspace, run.exec_deadline, run.cancel, emit)
        except PrepareStopped:
            self._stopped(run, op_id, -1)
            return None
        except PrepareFailure as failure:
            if run.reason is not None:
                self._stopped(run, op_id, -1)
                return None
            emit(f"[relevo] {failure.error_class.value}: {failure.message}")
            cause = {"prepare": failure.message, "agent_id": self.config.agent_id, "attempt": ref.attempt}
            self._conclude(run, op_id, StageStatus.FAILED, OperationOutcome.FAILED, None, error=failure.error_class, cause=json.dumps(cause))
            return None
        if run.reason is not None:
            self._stopped(run, op_id, -1)
            return None
        try:
            with call_budget(min(5.0, max(0.5, run.lease.fence_in()))):
                if prepared.restored is not None:
                    stage_attempts.record_restored(ref, prepared.restored)
                if context.envelope.checkout is not None or prepared.restored is not None:
                    stage_attempts.record_precondition(ref, prepared.precondition)
        except stage_attempts.LeaseLost:
            self._abandon(run, op_id)
            return None
        except (BotoCoreError, ClientError) as exc:
            log.warning("%s attempt %d: what the restore did was not recorded (%s)", op_id, ref.attempt, exc)
        self.journal.set_precondition(op_id, ref.attempt, prepared.precondition)
        return prepared

    def _claim(
        self, task: StageMessage, message: Message, ref: stage_attempts.StageRef, timeline: LeaseTimeline, claim_secret: str,
    ) -> ClaimGranted:
        """The claim (relevo_agent.claims), sent again with the same secret after a transient error
        (a reset may have lost the answer of a claim that landed), for as long as the lease could
        still be kept afterwards. A job's next stage is first offered to the Mac that ran the one
        before (its files are there): the route says which, and the message may be left to it."""
        from relevo_core.models.agent_session import ClaimRequest

        request = ClaimRequest(
            job_id=task.job_id, stage_index=task.stage_index, attempt=task.attempt, agent_id=self.config.agent_id,
            claim_secret=claim_secret, dispatch_key=task.dispatch_key, dispatch_token=task.task_token,
            journal_id=self.journal.journal_id, enqueued_at=message.sent_at,
            leave_to_previous=task.attempt == 1 and self.prefer_previous is not None, project=task.project, signs=task.signs,
        )
        routes = self.sessions.routes
        if routes is None:
            raise RouteError(0, None, "this agent knows no claim route: its stack file, or api_url in its config, names the stack's API")
        give_up = time.monotonic() + max(0.0, timeline.fence_after_sec - timeline.renew_interval_sec)
        delay = RETRY_AFTER_FAILURE_SEC
        while True:
            try:
                with call_budget(max(0.5, give_up - time.monotonic())):
                    return routes.claim(request)
            except RouteError as refused:
                if refused.code == ErrorCode.CLAIM_REFUSED.value:
                    raise stage_attempts.ClaimRefused(str(refused), refused.details, ref.attempt, int(utc_now().timestamp())) from refused
                if refused.code == ErrorCode.PREVIOUS_AGENT_PREFERRED.value and self.prefer_previous is not None:
                    previous_agent = str(refused.details.get("agent_id"))
                    if self.prefer_previous(previous_agent, task.requires, message, f"{task.job_id}/{task.stage}"):
                        raise _LeftToPrevious(previous_agent) from refused
                    request = request.model_copy(update={"leave_to_previous": False})
                    continue
                if refused.code in (ErrorCode.JOB_NOT_FOUND.value, ErrorCode.ENVELOPE_VERSION_UNSUPPORTED.value, ErrorCode.DISPATCH_NOT_FOUND.value):
                    # The route failed the dispatch of a job that is gone or unreadable; one this
                    # region was not handed (or under another key) is not this agent's to run.
                    raise _DispatchEnded(str(refused)) from refused
                raise
            except RouteUnreachable as exc:
                if time.monotonic() + delay > give_up:
                    raise
                if not reachability.failed(exc):
                    log.warning("%s/%d: claim failed (%s); sending it again", ref.job_id, ref.stage_index, exc)
                time.sleep(delay)
                delay = min(2 * delay, 2.0)

    def _refused(self, op_id: str, ref: stage_attempts.StageRef, refused: stage_attempts.ClaimRefused, message: Message) -> None:
        found = refused.item
        if refused.held:
            # A redelivery while the holder's lease lives: back when that lease would have ended.
            log.info("%s attempt %d is held by %s; its message returns when that lease would end", op_id, ref.attempt, found.get("agent_id"))
            back_in = int(found.get("lease_expires_at", 0)) - int(utc_now().timestamp()) + 1
            message.give_back_after(min(60, max(1, back_in)))
            return
        log.info(
            "%s attempt %d is over (%s attempt %s, %s): its message is deleted",
            op_id, ref.attempt, found.get("status"), found.get("attempt"), found.get("agent_id"),
        )
        message.delete()

    def _taken(self, run: StageRun, op_id: str) -> bool:
        """After an accept whose answer was lost: the state machine took the claim if it hands
        this attempt its run token (the keeper looks)."""
        run.token_known.wait(RUN_TOKEN_WAIT_SEC + 5)
        if run.run_token and run.reason is None:
            log.info("%s attempt %d: the state machine took the claim after all", op_id, run.ref.attempt)
            return True
        return False

    def _let_go(self, run: StageRun, op_id: str) -> None:
        try:
            if stage_attempts.let_go(run.ref, utc_now()):
                log.info("%s attempt %d: the dispatch no longer waited for this claim; let go of it", op_id, run.ref.attempt)
        except (BotoCoreError, ClientError) as exc:
            log.warning("%s attempt %d: could not let go of a claim nothing ran under (%s); it lapses with its lease", op_id, run.ref.attempt, exc)

    def _back_when_lease_ends(self, run: StageRun, op_id: str, message: Message) -> None:
        """Fenced before the state machine was seen to take the claim (the accept's answers were
        lost): the dispatch may still be waiting for one, and only a claim of this same attempt
        can give it. Such a claim is refused until the lease this one took has ended, so the
        message comes back just after that, for this agent or another, instead of after the work
        queue's 60 s visibility timeout. Had the state machine taken the claim after all, the
        next claim's accept meets an answered token and lets the message go (its retry comes
        from the lapsed heartbeat)."""
        back_in = max(1, math.ceil(run.lease.deadline - time.monotonic()) + 1)
        log.info("%s attempt %d: fenced before the claim was taken; its message returns in %ds", op_id, run.ref.attempt, back_in)
        message.give_back_after(back_in)

    def _after_previous_fence(self, run: StageRun, op_id: str, previous: dict[str, Any]) -> bool:
        """A successor probes (or runs) only once the previous holder has fenced: after that
        holder's recorded lease end plus the allowed clock skew, by this clock. False if the run
        was stopped meanwhile."""
        lease_end = previous.get("lease_expires_iso")
        if not lease_end:
            return True
        wait = datetime.fromisoformat(str(lease_end)).timestamp() + self.config.max_clock_skew_sec - time.time()
        if wait <= 0:
            return True
        log.info(
            "%s attempt %d: waiting %.1fs for attempt %s's holder to have fenced (its lease end %s plus %gs of skew)",
            op_id, run.ref.attempt, wait, previous.get("attempt"), lease_end, self.config.max_clock_skew_sec,
        )
        return not run.cancel.wait(wait)

    def _stage_env(self, envelope: JobEnvelope, task: StageMessage, workspace: Path, prepared: Prepared) -> dict[str, str]:
        # Made after the checkout (its git clean would remove it), inside the workspace as ever.
        artifact_dir = workspace / ".relevo-artifacts" / task.job_id / task.stage
        artifact_dir.mkdir(parents=True, exist_ok=True)
        relevo = {
            "RELEVO_JOB_ID": task.job_id,
            "RELEVO_STAGE": task.stage,
            "RELEVO_ATTEMPT": str(task.attempt),
            "RELEVO_OPERATION_ID": operation_id(task.job_id, task.stage),
            "RELEVO_WORKSPACE": str(workspace),
            "RELEVO_ARTIFACT_DIR": str(artifact_dir),
            "RELEVO_REF": envelope.ref,
            # The commit, and every earlier stage's values (RELEVO_OUT_<STAGE>_<KEY>).
            **prepared.variables,
            # A workspace is never taken for part of a repository around it: git in a stage looks
            # no higher than the workspace root (without a checkout the workspace is no repository).
            "GIT_CEILING_DIRECTORIES": str(self.config.workspace_root),
        }
        # Never the agent's credentials (relevo_agent.stage_env).
        return stage_environment(os.environ, relevo, envelope.stage(task.stage).aws_profile)

    def _previous_outputs(self, local: Operation | None, previous: dict[str, Any]) -> dict[str, str]:
        """What the previous attempt recorded of its values as it ran: on its stage record, or
        (when it ran here) in this journal, which has them first."""
        outputs = previous.get("outputs") if isinstance(previous.get("outputs"), dict) else {}
        if local is not None and local.attempt == previous.get("attempt") and local.outputs:
            outputs = {**outputs, **local.outputs}
        return {str(key): str(value) for key, value in (outputs or {}).items()}

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
        prepared: Prepared | None,
    ) -> bool:
        """Decide the previous attempt's unknown outcome. True: run the stage; False: decided."""
        ref = run.ref
        probe = None
        previous_outputs = self._previous_outputs(local, previous)
        if plan.effect_probe and reconcile.wants_probe(local, previous):
            # The probe asks about what the previous attempt recorded (a submission id, say).
            from relevo_core.models.handoff import previous_output_variable

            probe_env = {**env, "RELEVO_PROBE": "1", **{previous_output_variable(k): v for k, v in previous_outputs.items()}}
            result = self._run(run, plan, plan.effect_probe, workspace, probe_env, lambda chunk: None, probe=True)
            if run.reason is not None:
                self._stopped(run, op_id, result.exit_code)
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
        log.info("%s attempt %d reconciled: %s %s", op_id, ref.attempt, reconciled.action.value, reconciled.evidence)
        try:
            stage_attempts.record_reconciled(ref, reconciled.action.value, reconciled.evidence, utc_now())
        except stage_attempts.LeaseLost:
            self._abandon(run, op_id)
            return False
        if reconciled.action is reconcile.ReconcileAction.RERUN:
            return True
        if reconciled.action in (reconcile.ReconcileAction.RESEND, reconcile.ReconcileAction.SUCCEEDED):
            self._conclude(run, op_id, StageStatus.SUCCEEDED, OperationOutcome.RECONCILED, reconciled.receipt, exit_code=0)
        elif reconciled.action is reconcile.ReconcileAction.MANUAL_REVIEW:
            self._conclude(
                run, op_id, StageStatus.MANUAL_REVIEW, OperationOutcome.RECONCILED, None,
                error=ErrorClass.MANUAL_REVIEW, cause=json.dumps(reconciled.evidence), stage_outcome=stage_attempts.AttemptOutcome.MANUAL_REVIEW,
            )
        else:
            self._conclude(
                run, op_id, StageStatus.FAILED, OperationOutcome.RECONCILED, None,
                error=ErrorClass.PRECONDITION_CHANGED, cause=json.dumps(reconciled.evidence),
            )
        return False

    def _run(
        self,
        run: StageRun,
        plan: StagePlan,
        command: str,
        workspace: Path,
        env: dict[str, str],
        on_output: Any,
        probe: bool = False,
    ) -> ExecResult:
        """One command of the attempt under its lease: its exec time counts from the claim, its
        dead-man supervisor follows the lease, and the journal knows its process group while it
        runs. A command that ended at or after the fence was fenced, whoever killed it."""
        op_id = operation_id(run.ref.job_id, plan.name)
        timeout = min(run.exec_left(), 300.0) if probe else run.exec_left()
        result = run_command(
            command,
            workspace,
            env,
            timeout_sec=timeout,
            cancel=run.cancel,
            on_output=on_output,
            grace_sec=plan.kill_grace_sec,
            lease=run.lease,
            stop_grace_sec=lambda: run.stop_grace(plan.kill_grace_sec),
            on_start=lambda pgid: self.journal.set_process_group(op_id, run.ref.attempt, pgid),
            user=self.config.build_user,  # run_as: the command and the workspace are that user's
        )
        self.journal.set_process_group(op_id, run.ref.attempt, None)
        if run.reason is None and run.lease.fenced(result.ended_at):
            # Its supervisor got there first (this agent was frozen, or slow to see the deadline).
            log.warning("%s attempt %d: the command ended at the lease fence; its result is withheld", op_id, run.ref.attempt)
            run.stop("fenced")
        return result

    def _execute(
        self, run: StageRun, plan: StagePlan, op_id: str, workspace: Path, env: dict[str, str], envelope: JobEnvelope,
        shipper: Any, prepared: Prepared,
    ) -> None:
        from relevo_agent.artifacts import upload_stage_artifacts
        from relevo_agent.outputs import OutputInvalid, OutputWatch

        ref = run.ref
        if run.reason is not None:  # stopped while reconciling or waiting
            self._abandon(run, op_id)
            return
        keychain = None
        if envelope.signing is not None:
            try:
                self.keychains.require()  # on an agent that cannot, before any secret is read
                identities = read_identities(envelope.signing)
                keychain = self.keychains.create(f"{ref.job_id}.{plan.name}.{ref.attempt}", identities, plan.exec_timeout_sec)
            except KeychainFailure as failure:
                log.warning("%s attempt %d: no signing keychain: %s", op_id, ref.attempt, failure.message)
                cause = {"keychain": failure.message, "agent_id": self.config.agent_id, "attempt": ref.attempt}
                self._conclude(
                    run, op_id, StageStatus.FAILED, OperationOutcome.FAILED, None, error=failure.error_class, cause=json.dumps(cause),
                )
                return
            env = {**env, "RELEVO_KEYCHAIN": str(keychain)}
        # The stage's values ($RELEVO_OUTPUT, relevo_agent.outputs): journaled, then recorded
        # (fenced) as each line completes, beside the command.
        watch = OutputWatch.create(
            self.config.workspace_root / ".relevo-outputs" / f"{ref.job_id}.{plan.name}.{ref.attempt}",
            secret_values(self.config.mask, env), lambda values, changed: self._outputs_changed(run, op_id, shipper, values, changed),
            owner=self.config.build_user,
        )
        env = {**env, "RELEVO_OUTPUT": str(watch.path)}
        watch.start()
        outputs: dict[str, str] = {}
        error: ErrorClass | None = None
        why: str | None = None
        handoff = None
        # Lines marked ::warning:: are counted on their way to the log (relevo_agent.warning_lines).
        warnings = WarningLines(shipper.write)
        try:
            result = self._run(run, plan, plan.command, workspace, env, warnings.write)
            ended_well = warning_lines.ended_well(plan, result.exit_code)
            try:
                outputs = watch.stop()
            except OutputInvalid as invalid:
                outputs, error, why = dict(watch.parser.values), ErrorClass.OUTPUT_INVALID, str(invalid)
            # Artifacts (relevo_agent.artifacts), then the handoff: stored after success while the
            # lease is still kept, each record fenced on the attempt.
            if ended_well and run.reason is None and error is None:
                error = upload_stage_artifacts(
                    ref, plan.name, Path(env["RELEVO_ARTIFACT_DIR"]), envelope, self.config, shipper, run.cancel, run.transfer
                )
            if ended_well and run.reason is None and error is None and plan.handoff:
                handoff, error, why = self._store_handoff(run, plan, workspace, envelope, shipper, prepared)
        finally:
            watch.path.unlink(missing_ok=True)
            if keychain is not None:
                # Every ending of the command (exit, exec timeout, cancel, shutdown) comes here;
                # a failed delete is logged and swept at the next start, never the stage's failure.
                self.keychains.delete(keychain)
        if run.reason is not None:
            self._stopped(run, op_id, result.exit_code)
            return
        receipt: dict[str, Any] = {
            "exit_code": result.exit_code,
            "duration_sec": round(result.duration_sec, 3),
            "artifacts": _checksums(Path(env["RELEVO_ARTIFACT_DIR"])),
            "agent_id": self.config.agent_id,
            "attempt": ref.attempt,
            "outputs": outputs,
        }
        if handoff is not None:
            receipt["handoff"] = handoff
        if ended_well and error is None:
            warned = warning_lines.warning_summary(plan, result.exit_code, warnings)
            if warned is not None:
                receipt["warnings"] = warned
                shipper.line(f"[relevo] succeeded with warnings: {warned['text']}")
            status = StageStatus.WARNING if warned else StageStatus.SUCCEEDED
            self._conclude(run, op_id, status, OperationOutcome.SUCCEEDED, receipt, exit_code=result.exit_code)
            log.info("%s %s in %.1fs", op_id, "succeeded with warnings" if warned else "succeeded", result.duration_sec)
            return
        cause: dict[str, Any] = {"exit_code": result.exit_code, "agent_id": self.config.agent_id, "attempt": ref.attempt}
        if why:
            cause["why"] = why
            shipper.line(f"[relevo] {error.value if error else ''}: {why}")
        if result.signaled and not result.timed_out:
            # Killed by a signal this agent did not send (an operator, the OOM killer): what it had
            # done is unknown, so it is retried and the retry reconciles before it runs anything.
            cause["killed_by_signal"] = result.signaled
            self._conclude(
                run, op_id, StageStatus.FAILED, OperationOutcome.FAILED, receipt, exit_code=result.exit_code,
                error=ErrorClass.TRANSIENT_EXIT, cause=json.dumps(cause), stage_outcome=stage_attempts.AttemptOutcome.UNKNOWN,
            )
            log.warning("%s was killed by signal %d, not by this agent: retried, reconciled first", op_id, result.signaled)
            return
        error = error or classify(result.exit_code, result.output_tail, plan.retry, result.timed_out)
        self._conclude(
            run, op_id, StageStatus.FAILED, OperationOutcome.FAILED, receipt, exit_code=result.exit_code, error=error, cause=json.dumps(cause),
        )
        log.info("%s failed: %s (exit %d)", op_id, error.value, result.exit_code)

    def _outputs_changed(self, run: StageRun, op_id: str, shipper: Any, values: dict[str, str], changed: list[str]) -> None:
        """New values of the command's: journaled first, then recorded on the stage, fenced."""
        ref = run.ref
        self.journal.set_outputs(op_id, ref.attempt, values)
        for key in changed:
            shown = values[key] if len(values[key]) <= 200 else values[key][:200] + "…"
            shipper.line(f"[relevo] output {key}={shown}" if "\n" not in shown else f"[relevo] output {key} ({values[key].count(chr(10)) + 1} lines)")
        try:
            with call_budget(min(5.0, max(0.5, run.lease.fence_in()))):
                stage_attempts.record_outputs(ref, values)
        except stage_attempts.LeaseLost:
            log.warning("%s attempt %d: its values were refused: the attempt is no longer held", op_id, ref.attempt)

    def _store_handoff(
        self, run: StageRun, plan: StagePlan, workspace: Path, envelope: JobEnvelope, shipper: Any, prepared: Prepared
    ) -> tuple[dict[str, Any] | None, ErrorClass | None, str | None]:
        """(the summary for the receipt, or the error class and why the stage fails)."""
        from relevo_agent.artifacts import bucket_region
        from relevo_agent.handoff import HandoffFailure
        from relevo_agent.handoff.store import store_handoff
        from relevo_agent.prepare import handoff_cache

        ref = run.ref

        def emit(line: str) -> None:
            line = shipper.masker.mask(line)
            log.info("%s/%s %s", ref.job_id, plan.name, line)
            shipper.line(line)

        try:
            region = bucket_region(envelope.artifact_uri.removeprefix("s3://").split("/", 1)[0])
        except Exception:  # noqa: BLE001 - the store itself says what is wrong with the bucket
            region = ""
        location = self.config.location_region
        try:
            summary = store_handoff(
                ref, plan.name, workspace, plan.handoff, envelope.artifact_uri, envelope.ttl, prepared.known, handoff_cache(self.config),
                emit, run.cancel, max_job_bytes=envelope.artifact_max_job_bytes, bucket_region=region,
                crosses_region=None if location is None or not region else region != location,
            )
        except HandoffFailure as failure:
            return None, failure.error_class, failure.message
        except stage_attempts.LeaseLost:
            emit("[relevo] handoff records refused: the attempt is no longer held")
            run.stop("lease_lost")
            return None, None, None
        return summary.model_dump(mode="json"), None, None

    def _stopped(self, run: StageRun, op_id: str, exit_code: int) -> None:
        """The command was stopped before its end: by a shutdown (reported, retryable, outcome
        unknown so the retry reconciles), fenced (the lease deadline came: killed, result
        withheld), or taken over or canceled (nothing claimed: another attempt may own the stage)."""
        if run.reason == "shutdown":
            self._conclude(
                run, op_id, StageStatus.FAILED, OperationOutcome.ABANDONED, None, exit_code=exit_code,
                error=ErrorClass.AGENT_SHUTDOWN, cause="the agent was shut down while the stage ran",
                stage_outcome=stage_attempts.AttemptOutcome.UNKNOWN,
            )
            return
        if run.reason == "fenced":
            log.warning("%s attempt %d fenced: killed at the lease deadline less the margin; result withheld", op_id, run.ref.attempt)
            self.journal.record(op_id, run.ref.attempt, OperationOutcome.FENCED, None, None)
            return
        log.warning("%s attempt %d stopped (%s); result withheld", op_id, run.ref.attempt, run.reason)
        self._abandon(run, op_id)

    def _abandon(self, run: StageRun, op_id: str) -> None:
        self.journal.record(op_id, run.ref.attempt, OperationOutcome.ABANDONED, None, None)

    def _conclude(
        self,
        run: StageRun,
        op_id: str,
        status: StageStatus,
        outcome: OperationOutcome,
        receipt: dict[str, Any] | None,
        exit_code: int | None = None,
        error: ErrorClass | None = None,
        cause: str | None = None,
        stage_outcome: stage_attempts.AttemptOutcome | None = None,
    ) -> None:
        """Journal first (outcome, receipt and the outbox entry in one transaction), then report."""
        ref = run.ref
        # The log's last lines are stored while the attempt is still held: the report ends it.
        run.close_log()
        # A fast command can end before the token is decided. The result is journaled either
        # way; without a token the report still makes its fenced stage write (relevo_agent.outbox).
        run.token_known.wait(RUN_TOKEN_WAIT_SEC + 5)
        report = StageReport(
            job_id=ref.job_id,
            stage=op_id.split(":", 1)[1],
            stage_index=ref.stage_index,
            attempt=ref.attempt,
            run_token=run.run_token,
            status=status,
            outcome=stage_outcome or _stage_outcome(status),
            exit_code=exit_code,
            error=error.value if error else None,
            cause=cause,
            receipt=receipt,
            lease_ended=True,  # nothing of this attempt runs any more here
            claim_secret=run.claim_secret,
        )
        self.journal.record(op_id, ref.attempt, outcome, receipt, report.payload())
        # The report's sending lets the attempt's job credentials go (relevo_agent.outbox).
        run.reported = True
        self.outbox.flush()

    # ------------------------------------------------------------------ claim handshake and run token
    def _accept(self, run: StageRun, dispatch_token: str) -> bool | None:
        """Tell the state machine who claimed the stage. Once it has taken the answer, its next
        state hands exactly this claim a run token (written only if the claim still holds), so the
        command may start now: were the execution stopped or the stage taken over before the
        token arrives, the keeper stops the command and no result is ever reported for it.

        A transient error is retried for as long as the lease keeps (the keeper renews it
        meanwhile). True: taken. False: the dispatch no longer waits. None: cannot tell (an
        answer was lost, and a repeat met a token already answered, maybe by the first send)."""
        ref = run.ref
        output = json.dumps({"agent_id": self.config.agent_id, "attempt": ref.attempt})
        unsure = False
        delay = RETRY_AFTER_FAILURE_SEC
        while run.reason is None:
            try:
                with call_budget(min(5.0, max(0.5, run.lease.fence_in()))):  # one send per try: a repeat is ours to count
                    client("stepfunctions").send_task_success(taskToken=dispatch_token, output=output)
                return True
            except ClientError as exc:
                code = exc.response["Error"]["Code"]
                if code in DEAD_TOKEN:
                    if unsure:
                        return None
                    log.warning("%s/%d: the dispatch is no longer waiting (%s)", ref.job_id, ref.stage_index, code)
                    return False
                why = code
            except BotoCoreError as exc:
                why = str(exc)
            unsure = True
            log.warning("%s/%d: accept failed (%s); sending it again", ref.job_id, ref.stage_index, why)
            if run.cancel.wait(delay):
                break
            delay = min(2 * delay, 2.0)
        return None

    def _look_for_run_token(self, run: StageRun, op_id: str, deadline: float, check_job: bool) -> bool:
        """One look for the run token the state machine hands the accepted claim. True once it is
        decided: the token came (and is journaled), or the run was stopped because the stage
        changed hands, the job ended without handing it out, or the deadline passed."""
        ref = run.ref
        try:
            token = stage_attempts.run_token(ref)
            if token:
                self.journal.set_run_token(op_id, ref.attempt, token)
                run.run_token = token
                return True
            if check_job and JobStatus(_job_record(self.table_name, ref.job_id)["status"]).terminal:
                log.warning("%s attempt %d: the job ended before its run token came; stopping", op_id, ref.attempt)
                run.stop("canceled")
                return True
        except stage_attempts.LeaseLost as lost:
            if lost.ended:
                log.warning("%s attempt %d: the stage ended with its job before its run token came; stopping", op_id, ref.attempt)
                run.stop("canceled")
            else:
                log.warning("%s attempt %d: the stage changed hands before its run token came", op_id, ref.attempt)
                run.stop("lease_lost")
            return True
        except RelevoError:  # the job record is gone: deleted once it ended
            run.stop("canceled")
            return True
        except (ClientError, BotoCoreError) as exc:
            log.debug("%s attempt %d: run token read failed (%s)", op_id, ref.attempt, exc)
        if time.monotonic() >= deadline:
            log.warning("%s attempt %d: no run token after %.0fs; stopping the stage", op_id, ref.attempt, RUN_TOKEN_WAIT_SEC)
            run.stop("no_run_token")
            return True
        return False

    def _watch_for_run_token(self, run: StageRun, op_id: str, message: Message) -> None:
        """Beside the stage, from the accepted claim on: look for the run token (every 50 ms
        until it is decided), then delete the claimed message; both off the path to the
        command's start, each call bounded by the time left before the fence."""
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



def _job_record(table: str, job_id: str) -> dict[str, Any]:
    from relevo_core.store.jobs import get_job_record

    return get_job_record(table, job_id)


def _stage_outcome(status: StageStatus) -> stage_attempts.AttemptOutcome:
    return stage_attempts.AttemptOutcome.SUCCEEDED if status.succeeded else stage_attempts.AttemptOutcome.FAILED


def _checksums(directory: Path) -> dict[str, str]:
    """sha256 of each file the stage left in its artifact directory (for the receipt): the files
    the upload takes (relevo_agent.artifacts), never what a link points to, which may be a file of
    the agent's the build cannot read itself (run_as)."""
    if not directory.is_dir() or directory.is_symlink():
        return {}
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }
