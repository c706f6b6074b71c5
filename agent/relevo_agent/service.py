"""The agent's loops: poll while there is free capacity; per stage, claim, keep the lease and
the task heartbeat alive on their own ticker, reconcile an unknown previous outcome, run, journal,
report; an outbox flusher re-sends reports the network lost; staged shutdown.

A stage's life on this agent:

    journal.begin ─► claim (fenced; returns what the previous attempt left) ─► accept (dispatch token)
      ─► [beside the stage: message deleted, run token fetched, lease renewed, task heartbeat]
      ─► previous outcome unknown? reconcile: resend receipt | probe ─► succeeded / manual_review /
         precondition changed (reported, not run) | re-run
      ─► run (own process group, watchdog) ─► journal.record(outcome, receipt, outbox entry)
      ─► report (fenced stage write + task token) ─► outbox entry removed

Shutdown (the signal handler only counts signals): 1st stop taking work and let running stages
finish; 2nd cancel them (group SIGTERM, then SIGKILL) and report Relevo.Transient.AgentShutdown;
3rd exit at once (each stage's watchdog still kills its process group).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, ConfigDict, ValidationError

from relevo_agent import reconcile
from relevo_agent.classify import classify
from relevo_agent.config import AgentConfig
from relevo_agent.artifacts import upload_stage_artifacts
from relevo_agent.executor import TAIL_BYTES, run_command
from relevo_agent.journal import Journal, Operation, Outcome, operation_id
from relevo_agent.logs import Masker, secret_values, start_shipper
from relevo_agent.presence import Presence, sent_at
from relevo_agent.stage_env import stage_environment
from relevo_core.aws import client
from relevo_core.models.envelope import JobEnvelope
from relevo_core.models.errors import ErrorClass, RelevoError
from relevo_core.models.plan import StagePlan
from relevo_core.models.status import JobStatus, StageStatus
from relevo_core.store import stage_attempts
from relevo_core.store.jobs import get_envelope, get_job_record

log = logging.getLogger("relevo_agent")

# The execution no longer waits for this token (canceled, timed out, answered).
_DEAD_TOKEN = ("TaskTimedOut", "TaskDoesNotExist", "InvalidToken")
RESTART_INTERRUPTED = "agent_restart_interrupted"
# How long an accepted claim waits for the state machine's run token before the attempt is given
# up (the execution was stopped, or the stage changed hands, between the claim and the token).
RUN_TOKEN_WAIT_SEC = 30.0
RUN_TOKEN_POLL_SEC = 0.05


class StageMessage(BaseModel):
    """What the state machine puts on a region's work queue."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str
    stage: str
    stage_index: int
    attempt: int  # 1, 2, ...: the fencing token of this attempt
    task_token: str  # answers the dispatch (the claim); the run has a token of its own
    # Retries only: the agents that ran the failed attempts, to be left to another agent if one is free.
    avoid_agents: tuple[str, ...] = ()
    queue_timeout_sec: int | None = None


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class StageRun:
    """One attempt this agent is running: what the keeper, shutdown and the runner share."""

    ref: stage_attempts.StageRef
    # Handed over by the state machine once it has seen the accepted claim; fetched beside the
    # stage (the command does not wait for it). Every report and heartbeat needs it.
    run_token: str | None = None
    token_known: threading.Event = field(default_factory=threading.Event)
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    # Why the command is being stopped: lease_lost, fenced, canceled, no_run_token, shutdown.
    reason: str | None = None

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.cancel.set()


class Agent:
    def __init__(self, config: AgentConfig, table_name: str, queue_url: str, journal: Journal | None = None) -> None:
        self.config = config
        self.table_name = table_name
        self.queue_url = queue_url
        self.journal = journal or Journal(config.journal)
        # Set by the signal handler, read by the supervisor loop: 1 drain, 2 cancel, 3 exit.
        self.signals = 0
        self.stopping = threading.Event()
        self._slots = threading.Semaphore(config.capacity)
        self._running: dict[str, StageRun] = {}
        self._running_lock = threading.Lock()
        self._active = 0
        self._flush_lock = threading.Lock()
        self.presence = Presence(config, table_name, queue_url, self.stopping)

    # ------------------------------------------------------------------ loops
    def run(self) -> int:
        """Supervise until shut down; returns the process exit status."""
        self.recover()
        poller = threading.Thread(target=self._poll, name="poll", daemon=True)
        flusher = threading.Thread(target=self._flush_outbox_loop, name="outbox", daemon=True)
        poller.start()
        flusher.start()
        canceled = False
        while True:
            if self.signals >= 3:
                log.warning("third signal: exiting now; watchdogs kill the running stages")
                return 130
            if self.signals >= 1 and not self.stopping.is_set():
                log.info("shutdown: taking no more work; %d stage(s) running", self._active)
                self.stopping.set()
            if self.signals >= 2 and not canceled:
                canceled = True
                log.warning("second signal: canceling running stages")
                with self._running_lock:
                    for run in self._running.values():
                        run.stop("shutdown")
            if self.stopping.is_set() and self._active == 0 and not poller.is_alive():
                self.flush_outbox()
                self.presence.stop()  # marks this agent offline: retries stop waiting for it
                return 0
            time.sleep(0.1)

    def _poll(self) -> None:
        log.info("agent %s polling %s (capacity %d)", self.config.agent_id, self.queue_url, self.config.capacity)
        sqs = client("sqs")
        self.presence.start()
        while not self.stopping.is_set():
            if not self._slots.acquire(timeout=0.5):
                continue  # no free capacity: do not take work we cannot start
            try:
                response = sqs.receive_message(
                    QueueUrl=self.queue_url,
                    MaxNumberOfMessages=1,
                    WaitTimeSeconds=self.config.poll_wait_sec,
                    MessageSystemAttributeNames=["SentTimestamp", "ApproximateReceiveCount"],
                )
            except (ClientError, BotoCoreError) as exc:
                log.warning("receive failed (%s); retrying", exc)
                self._slots.release()
                self.stopping.wait(1)
                continue
            messages = response.get("Messages", [])
            if not messages:
                self._slots.release()
                continue
            if self.stopping.is_set():
                # Taken during the drain: hand it straight back to the other agents.
                self._give_back(messages[0])
                self._slots.release()
                return
            with self._running_lock:
                self._active += 1
            threading.Thread(target=self._handle, args=(messages[0],), name="stage", daemon=True).start()

    def _give_back(self, message: dict[str, Any]) -> None:
        try:
            client("sqs").change_message_visibility(
                QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
        except (ClientError, BotoCoreError):
            log.warning("could not hand message %s back; it returns after its visibility timeout", message.get("MessageId"))

    # ------------------------------------------------------------------ one stage
    def _handle(self, message: dict[str, Any]) -> None:
        try:
            task = StageMessage.model_validate_json(message["Body"])
        except ValidationError:
            log.error("unreadable stage message %s: left for the queue's redrive DLQ", message.get("MessageId"))
            self._release_slot()
            return
        try:
            if self.presence.leave_to_another(
                task.avoid_agents, task.queue_timeout_sec, message, f"{task.job_id}/{task.stage} attempt {task.attempt}"
            ):
                return
            with self.presence.occupied():
                self._run_stage(task, message["ReceiptHandle"], sent_at(message))
        except Exception:
            log.exception("stage %s/%s crashed in the agent", task.job_id, task.stage)
        finally:
            self._release_slot()

    def _release_slot(self) -> None:
        with self._running_lock:
            self._active -= 1
        self._slots.release()

    def _run_stage(self, task: StageMessage, receipt_handle: str, enqueued_at: datetime | None = None) -> None:
        try:
            envelope = get_envelope(self.table_name, task.job_id)
        except RelevoError as exc:
            client("stepfunctions").send_task_failure(taskToken=task.task_token, error=exc.code.value, cause=exc.message)
            client("sqs").delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt_handle)
            return
        plan = envelope.stage(task.stage)
        ref = stage_attempts.StageRef(self.table_name, task.job_id, task.stage_index, task.attempt, self.config.agent_id)
        op_id = operation_id(task.job_id, task.stage)
        if op_id in self._running:
            # A second delivery of a message this agent already claimed: the claim decides.
            log.info("%s is already running here; duplicate message dropped", op_id)
            client("sqs").delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt_handle)
            return
        workspace = self.config.workspace_root / envelope.project
        precondition = reconcile.precondition_version(workspace, envelope.ref, envelope.commit, plan.inputs)
        local = self.journal.get(op_id)
        # Journaled before the claim: every attempt this agent may hold is in its journal.
        self.journal.begin(Operation(op_id, task.job_id, task.stage, task.stage_index, task.attempt, str(workspace), precondition))
        try:
            previous = stage_attempts.claim(ref, envelope.lease_ttl_sec, _now(), precondition, enqueued_at)
        except stage_attempts.LeaseLost:
            log.info("%s attempt %d is held by another agent", op_id, ref.attempt)
            self.journal.record(op_id, ref.attempt, Outcome.ABANDONED, None, None)
            return
        log.info("claimed %s attempt %d", op_id, ref.attempt)
        if not self._accept(ref, task.task_token):
            self._delete_message(receipt_handle)
            self.journal.record(op_id, ref.attempt, Outcome.ABANDONED, None, None)
            return
        # The state machine has taken this claim as the dispatch's answer: the stage starts now.
        # The message, the run token and the lease are seen to beside it (_keep_lease).
        run = StageRun(ref)
        with self._running_lock:
            self._running[op_id] = run
        keeper = threading.Thread(
            target=self._keep_lease, args=(run, envelope.lease_ttl_sec, op_id, receipt_handle), daemon=True
        )
        keeper.start()
        try:
            env = self._stage_env(envelope, task, workspace)
            if stage_attempts.needs_reconcile(previous, ref.attempt) and not self._reconcile(
                run, plan, op_id, local, previous, precondition, workspace, env
            ):
                return
            self._execute(run, plan, op_id, workspace, env, envelope)
        finally:
            run.done.set()
            keeper.join(timeout=5)
            with self._running_lock:
                self._running.pop(op_id, None)

    def _stage_env(self, envelope: JobEnvelope, task: StageMessage, workspace: Path) -> dict[str, str]:
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
            "RELEVO_COMMIT": envelope.commit or "",
        }
        # Never the agent's credentials (relevo_agent.stage_env).
        return stage_environment(os.environ, relevo, envelope.stage(task.stage).aws_profile)

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
        if plan.effect_probe and reconcile.wants_probe(local, previous):
            result = run_command(
                plan.effect_probe,
                workspace,
                {**env, "RELEVO_PROBE": "1"},
                timeout_sec=min(plan.exec_timeout_sec, 300),
                cancel=run.cancel,
                on_output=lambda chunk: None,
                grace_sec=plan.kill_grace_sec,
                watchdog=True,
            )
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
        decision = reconcile.decide(op_id, local, previous, precondition, probe)
        log.info("%s attempt %d reconciled: %s %s", op_id, ref.attempt, decision.decision.value, decision.evidence)
        try:
            stage_attempts.record_reconciled(ref, decision.decision.value, decision.evidence, _now())
        except stage_attempts.LeaseLost:
            self._abandon(run, op_id)
            return False
        if decision.decision is reconcile.Decision.RERUN:
            return True
        if decision.decision in (reconcile.Decision.RESEND, reconcile.Decision.SUCCEEDED):
            self._conclude(run, op_id, StageStatus.SUCCEEDED, Outcome.RECONCILED, decision.receipt, exit_code=0)
        elif decision.decision is reconcile.Decision.MANUAL_REVIEW:
            self._conclude(
                run, op_id, StageStatus.MANUAL_REVIEW, Outcome.RECONCILED, None,
                error=ErrorClass.MANUAL_REVIEW, cause=json.dumps(decision.evidence), stage_outcome=stage_attempts.Outcome.MANUAL_REVIEW,
            )
        else:
            self._conclude(
                run, op_id, StageStatus.FAILED, Outcome.RECONCILED, None,
                error=ErrorClass.PRECONDITION_CHANGED, cause=json.dumps(decision.evidence),
            )
        return False

    def _execute(
        self, run: StageRun, plan: StagePlan, op_id: str, workspace: Path, env: dict[str, str], envelope: JobEnvelope
    ) -> None:
        ref = run.ref
        if run.reason is not None:  # stopped while reconciling
            self._abandon(run, op_id)
            return
        # Log shipping (relevo_agent.logs): masked, ordered chunks, never blocking the command,
        # each expiring when the job's envelope says (the stack's log retention).
        shipper = start_shipper(ref, plan.name, self.config, env, envelope.log_expires_at)
        try:
            result = run_command(
                plan.command,
                workspace,
                env,
                timeout_sec=plan.exec_timeout_sec,
                cancel=run.cancel,
                on_output=shipper.write,
                grace_sec=plan.kill_grace_sec,
                watchdog=True,
            )
            # Artifacts (relevo_agent.artifacts): uploaded after success while the lease is still kept.
            artifact_error = None
            if result.exit_code == 0 and run.reason is None:
                artifact_error = upload_stage_artifacts(
                    ref, plan.name, Path(env["RELEVO_ARTIFACT_DIR"]), envelope, self.config, shipper, run.cancel
                )
        finally:
            shipper.close()
        if run.reason is not None:
            self._stopped(run, op_id, result.exit_code)
            return
        receipt = {
            "exit_code": result.exit_code,
            "duration_sec": round(result.duration_sec, 3),
            "artifacts": _checksums(Path(env["RELEVO_ARTIFACT_DIR"])),
            "agent_id": self.config.agent_id,
            "attempt": ref.attempt,
        }
        if result.exit_code == 0 and artifact_error is None:
            self._conclude(run, op_id, StageStatus.SUCCEEDED, Outcome.SUCCEEDED, receipt, exit_code=0)
            log.info("%s succeeded in %.1fs", op_id, result.duration_sec)
            return
        error = artifact_error or classify(result.exit_code, result.output_tail, plan.retry, result.timed_out)
        self._conclude(
            run, op_id, StageStatus.FAILED, Outcome.FAILED, receipt, exit_code=result.exit_code, error=error,
            cause=json.dumps({"exit_code": result.exit_code, "agent_id": self.config.agent_id, "attempt": ref.attempt}),
        )
        log.info("%s failed: %s (exit %d)", op_id, error.value, result.exit_code)

    def _stopped(self, run: StageRun, op_id: str, exit_code: int) -> None:
        """The command was stopped before its end: by a shutdown (reported, retryable, outcome
        unknown so the retry reconciles), or fenced, taken over or canceled (nothing claimed:
        another attempt may own the stage)."""
        if run.reason == "shutdown":
            self._conclude(
                run, op_id, StageStatus.FAILED, Outcome.ABANDONED, None, exit_code=exit_code,
                error=ErrorClass.AGENT_SHUTDOWN, cause="the agent was shut down while the stage ran",
                stage_outcome=stage_attempts.Outcome.UNKNOWN,
            )
            return
        log.warning("%s attempt %d stopped (%s); result withheld", op_id, run.ref.attempt, run.reason)
        self._abandon(run, op_id)

    def _abandon(self, run: StageRun, op_id: str) -> None:
        self.journal.record(op_id, run.ref.attempt, Outcome.ABANDONED, None, None)

    def _delete_message(self, receipt_handle: str) -> None:
        """The claim is the durable record; the message has done its job. A failed delete only
        means a second delivery later, which the claim refuses while this attempt's lease lives."""
        try:
            client("sqs").delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt_handle)
        except (ClientError, BotoCoreError) as exc:
            log.warning("could not delete a claimed stage message (%s); the claim refuses its redelivery", exc)

    def _conclude(
        self,
        run: StageRun,
        op_id: str,
        status: StageStatus,
        outcome: Outcome,
        receipt: dict[str, Any] | None,
        exit_code: int | None = None,
        error: ErrorClass | None = None,
        cause: str | None = None,
        stage_outcome: stage_attempts.Outcome | None = None,
    ) -> None:
        """Journal first (outcome, receipt and the outbox entry in one transaction), then report."""
        ref = run.ref
        # A fast command can end before the token is decided. The result is journaled either
        # way; without a token the report still makes its fenced stage write (_send).
        run.token_known.wait(RUN_TOKEN_WAIT_SEC + 5)
        report = {
            "job_id": ref.job_id,
            "stage": op_id.split(":", 1)[1],
            "stage_index": ref.stage_index,
            "attempt": ref.attempt,
            "run_token": run.run_token,
            "status": status.value,
            "outcome": (stage_outcome or _stage_outcome(status)).value,
            "exit_code": exit_code,
            "error": error.value if error else None,
            "cause": cause,
            "receipt": receipt,
        }
        self.journal.record(op_id, ref.attempt, outcome, receipt, report)
        self.flush_outbox()

    # ------------------------------------------------------------------ reporting
    def flush_outbox(self) -> int:
        """Send what the journal holds unsent, oldest first; stop at the first network failure.
        Returns how many reports are still waiting."""
        with self._flush_lock:
            for report in self.journal.pending():
                if self._send(report.payload):
                    self.journal.sent(report.id)
                else:
                    self.journal.failed_to_send(report.id)
                    break
            return len(self.journal.pending())

    def _flush_outbox_loop(self) -> None:
        while True:
            time.sleep(self.config.outbox_interval_sec)
            try:
                self.flush_outbox()
            except Exception:
                log.exception("outbox flush failed")

    def _send(self, report: dict[str, Any]) -> bool:
        """One report: the fenced stage write, then the task token. True when done with it (sent,
        or refused for good because another attempt owns the stage); False to try again later."""
        ref = stage_attempts.StageRef(self.table_name, report["job_id"], report["stage_index"], report["attempt"], self.config.agent_id)
        status = StageStatus(report["status"])
        try:
            stage_attempts.finish(
                ref, status, _now(), report["exit_code"], report["error"],
                report["stage"] if status is StageStatus.SUCCEEDED else None,
                receipt=report["receipt"], outcome=stage_attempts.Outcome(report["outcome"]),
            )
        except stage_attempts.LeaseLost:
            log.warning("%s:%s attempt %d: report refused, another attempt holds the stage", report["job_id"], report["stage"], report["attempt"])
            return True
        except (BotoCoreError, ClientError) as exc:
            log.warning("report of %s:%s deferred to the outbox (%s)", report["job_id"], report["stage"], exc)
            return False
        token = report.get("run_token") or _stored_run_token(ref)
        if not token:
            return True  # never handed this attempt: the state machine's timeouts decide
        sfn = client("stepfunctions")
        try:
            if status is StageStatus.SUCCEEDED:
                output = {"stage": report["stage"], "attempt": report["attempt"], "agent_id": self.config.agent_id}
                sfn.send_task_success(taskToken=token, output=json.dumps(output))
            else:
                sfn.send_task_failure(taskToken=token, error=report["error"] or ErrorClass.COMMAND_FAILED.value, cause=report["cause"] or "")
        except ClientError as exc:
            if exc.response["Error"]["Code"] in _DEAD_TOKEN:
                log.warning("%s:%s attempt %d: the execution no longer waits for this report", report["job_id"], report["stage"], report["attempt"])
                return True
            log.warning("report of %s:%s deferred to the outbox (%s)", report["job_id"], report["stage"], exc)
            return False
        except BotoCoreError as exc:
            log.warning("report of %s:%s deferred to the outbox (%s)", report["job_id"], report["stage"], exc)
            return False
        return True

    # ------------------------------------------------------------------ restart recovery
    def recover(self) -> None:
        """Restart: every operation the journal shows in flight was interrupted (its watchdog
        killed the command when the agent died), and so was any attempt Relevo records as held by
        this agent that the journal does not know. Each is reported failed with cause
        agent_restart_interrupted and outcome unknown: Relevo.Transient.AgentShutdown is
        retryable, and the next attempt reconciles before it runs anything. Reports left in the
        outbox are sent."""
        for op in self.journal.in_flight():
            log.warning("restart: %s attempt %d was in flight; reporting it interrupted", op.operation_id, op.attempt)
            self._interrupted(op)
        # Attempts Relevo says this agent holds that the journal does not know (a lost journal):
        # failed the same way, so they follow the retry rules instead of waiting out the lease.
        try:
            held = stage_attempts.held_by(self.table_name, self.config.agent_id)
        except (BotoCoreError, ClientError) as exc:
            log.warning("restart: cannot list the attempts this agent holds (%s); their leases will expire", exc)
            held = []
        for item in held:
            job_id, stage = str(item["pk"]).removeprefix("JOB#"), str(item.get("stage_name", ""))
            known = self.journal.get(operation_id(job_id, stage))
            if known is not None and known.attempt == item.get("attempt"):
                continue
            log.warning("restart: %s:%s attempt %s is held here but not journaled; failing it", job_id, stage, item.get("attempt"))
            op = Operation(
                operation_id(job_id, stage), job_id, stage, int(item["stage_index"]), int(item["attempt"]), "", "",
                run_token=item.get("run_token"),
            )
            self.journal.begin(op)
            self._interrupted(op)
        self.flush_outbox()

    def _interrupted(self, op: Operation) -> None:
        report = {
            "job_id": op.job_id,
            "stage": op.stage,
            "stage_index": op.stage_index,
            "attempt": op.attempt,
            "run_token": op.run_token,
            "status": StageStatus.FAILED.value,
            "outcome": stage_attempts.Outcome.UNKNOWN.value,
            "exit_code": None,
            "error": ErrorClass.AGENT_SHUTDOWN.value,
            "cause": RESTART_INTERRUPTED,
            "receipt": None,
        }
        self.journal.record(op.operation_id, op.attempt, Outcome.ABANDONED, None, report)

    # ------------------------------------------------------------------ claim handshake and lease
    def _accept(self, ref: stage_attempts.StageRef, dispatch_token: str) -> bool:
        """Tell the state machine who claimed the stage. Once it has taken the answer, its next
        state hands exactly this claim a run token (written only if the claim still holds), so the
        command may start now: were the execution stopped or the stage taken over before the
        token arrives, the keeper stops the command and no result is ever reported for it."""
        try:
            client("stepfunctions").send_task_success(
                taskToken=dispatch_token, output=json.dumps({"agent_id": self.config.agent_id, "attempt": ref.attempt})
            )
        except ClientError as exc:
            log.warning("%s/%d: the dispatch is no longer waiting (%s)", ref.job_id, ref.stage_index, exc.response["Error"]["Code"])
            return False
        return True

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
            if check_job and JobStatus(get_job_record(self.table_name, ref.job_id)["status"]).terminal:
                log.warning("%s attempt %d: the job ended before its run token came; stopping", op_id, ref.attempt)
                run.stop("canceled")
                return True
        except stage_attempts.LeaseLost:
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

    def _keep_lease(self, run: StageRun, lease_ttl_sec: int, op_id: str, receipt_handle: str) -> None:
        """Beside the stage, from the accepted claim on: look for the run token (every 50 ms
        until it is decided) and then delete the claimed message, both off the path to the
        command's start; renew the lease, and heartbeat the task once the token is known, every
        lease/3. When renewal has failed for longer than the lease, the agent fences itself: the
        stage is killed and never reported as succeeded."""
        ref = run.ref
        interval = max(1.0, lease_ttl_sec / 3)
        renewed = time.monotonic()  # the claim has just written the lease
        renew_at = renewed + interval
        token_deadline, job_checked = renewed + RUN_TOKEN_WAIT_SEC, renewed
        try:
            while True:
                looking = not run.token_known.is_set()
                pause = RUN_TOKEN_POLL_SEC if looking else renew_at - time.monotonic()
                if run.done.wait(max(0.0, pause)):
                    return
                if looking:
                    # Slow to come: a job canceled meanwhile never hands one out (checked each second).
                    check_job = time.monotonic() - job_checked >= 1.0
                    job_checked = time.monotonic() if check_job else job_checked
                    if self._look_for_run_token(run, op_id, token_deadline, check_job):
                        run.token_known.set()
                        if run.reason is not None:
                            return
                        self._delete_message(receipt_handle)
                if time.monotonic() < renew_at:
                    continue
                try:
                    stage_attempts.renew_lease(ref, lease_ttl_sec, _now())
                    if run.run_token:
                        client("stepfunctions").send_task_heartbeat(taskToken=run.run_token)
                    renewed = time.monotonic()
                except stage_attempts.LeaseLost:
                    log.warning("%s stage %d: lease taken over; stopping the stage", ref.job_id, ref.stage_index)
                    run.stop("lease_lost")
                    return
                except ClientError as exc:
                    if exc.response["Error"]["Code"] in _DEAD_TOKEN:
                        log.warning("%s stage %d: the execution no longer waits for it; stopping", ref.job_id, ref.stage_index)
                        run.stop("canceled")
                        return
                    log.warning("heartbeat failed (%s); will retry", exc.response["Error"]["Code"])
                except BotoCoreError as exc:
                    log.warning("heartbeat failed (%s); will retry", exc)
                if time.monotonic() - renewed >= lease_ttl_sec:
                    log.warning("%s stage %d: lease not renewed for %ds; fencing myself", ref.job_id, ref.stage_index, lease_ttl_sec)
                    run.stop("fenced")
                    return
                renew_at = time.monotonic() + min(interval, max(0.1, renewed + lease_ttl_sec - time.monotonic()))
        finally:
            run.token_known.set()  # whoever waits for the token is not left waiting


def _stored_run_token(ref: stage_attempts.StageRef) -> str | None:
    """The run token on the stage record, for a report journaled before the token was known."""
    try:
        return stage_attempts.run_token(ref)
    except (stage_attempts.LeaseLost, ClientError, BotoCoreError):
        return None


def _stage_outcome(status: StageStatus) -> stage_attempts.Outcome:
    return stage_attempts.Outcome.SUCCEEDED if status is StageStatus.SUCCEEDED else stage_attempts.Outcome.FAILED


def _checksums(directory: Path) -> dict[str, str]:
    """sha256 of each file the stage left in its artifact directory (for the receipt)."""
    if not directory.is_dir():
        return {}
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }
