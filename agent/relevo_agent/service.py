"""The agent's loops: poll while there is free capacity; per stage, claim, keep the lease and
the task heartbeat alive on their own ticker, reconcile an unknown previous outcome, run, journal,
report; an outbox flusher re-sends reports the network lost; staged shutdown.

A stage's life on this agent:

    journal.begin ─► claim (fenced; returns what the previous attempt left) ─► accept (dispatch token)
      ─► [beside the stage: message deleted, run token fetched, lease renewed, task heartbeat,
          and the fence: at the lease deadline less the margin the command is killed]
      ─► previous outcome unknown? wait until its holder has fenced (its lease end + the allowed
         skew), then reconcile: resend receipt | probe ─► succeeded / manual_review /
         precondition changed (reported, not run) | re-run
      ─► run (own process group, dead-man supervisor) ─► journal.record(outcome, receipt, outbox entry)
      ─► report (fenced stage write + task token) ─► outbox entry removed

The lease is a deadline on this process's monotonic clock (relevo_agent.lease): every call the
lease path makes is bounded by the time left before it (relevo_core.aws.call_budget), and the
fence comes from its own thread, so no network call can hold it back. A frozen agent's command
is killed by its supervisor, a process of its own.

Shutdown (the signal handler only counts signals): 1st stop taking work and let running stages
finish; 2nd cancel them (group SIGTERM, then SIGKILL) and report Relevo.Transient.AgentShutdown;
3rd exit at once (each stage's supervisor still kills its process group).
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
from relevo_agent.executor import TAIL_BYTES, ExecResult, run_command
from relevo_agent.journal import Journal, Operation, Outcome, operation_id
from relevo_agent.lease import Lease
from relevo_agent.logs import Masker, secret_values, start_shipper
from relevo_agent.presence import Presence, sent_at
from relevo_agent.stage_env import stage_environment
from relevo_core.aws import call_budget, client
from relevo_core.lease_timeline import RETRY_AFTER_FAILURE_SEC, LeaseTimeline
from relevo_core.models.envelope import JobEnvelope
from relevo_core.models.errors import ErrorClass, RelevoError
from relevo_core.models.plan import StagePlan
from relevo_core.models.status import JobStatus, StageStatus
from relevo_core.store import stage_attempts
from relevo_core.store.agents import AgentIdInUse
from relevo_core.store.jobs import get_envelope, get_job_record

log = logging.getLogger("relevo_agent")

# The journal's record of the instance this agent last ran as (see Presence.take).
INSTANCE_KEY = "instance_id"

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
    lease: Lease
    # Monotonic: the claim's send time plus the stage's exec_timeout_sec (the exec timeout counts
    # from the claim, probe and waits included).
    exec_deadline: float = math.inf
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

    def stop_grace(self, kill_grace_sec: float) -> float:
        """SIGTERM-to-SIGKILL grace of a stop: a fence gives what the lease leaves of the grace."""
        return self.lease.grace_sec if self.reason == "fenced" else kill_grace_sec

    def exec_left(self) -> float:
        return max(0.0, self.exec_deadline - time.monotonic())


class HandBack(Exception):
    """Trouble before the claim took (a connection reset, a timeout): the message goes straight
    back to the queue (visibility 0) for this agent or another to take, never waits out its
    visibility timeout."""


# Exit statuses of `relevo-agent run` besides 0 (a clean stop) and 130 (the third signal).
EXIT_AGENT_ID_IN_USE = 2
EXIT_STACK_GONE = 3
# Error codes that say a resource of the stack no longer exists (DynamoDB's table or index; SQS's
# queue, in its query and JSON protocol spellings): retrying cannot help, a restart with the
# current stack file can.
_GONE = {
    "ResourceNotFoundException": "the table {table}",
    "AWS.SimpleQueueService.NonExistentQueue": "the work queue {queue}",
    "QueueDoesNotExist": "the work queue {queue}",
}
STACK_FILE_CHECK_SEC = 5.0
FATAL_STOP_WAIT_SEC = 10.0


class Agent:
    def __init__(self, config: AgentConfig, table_name: str, queue_url: str, journal: Journal | None = None) -> None:
        self.config = config
        self.table_name = table_name
        self.queue_url = queue_url
        self.journal = journal or Journal(config.journal)
        # Set by the signal handler, read by the supervisor loop: 1 drain, 2 cancel, 3 exit.
        self.signals = 0
        self.stopping = threading.Event()
        # Why this agent must exit (its stack is gone, another process took its agent_id).
        self.fatal: str | None = None
        self._slots = threading.Semaphore(config.capacity)
        self._running: dict[str, StageRun] = {}
        self._running_lock = threading.Lock()
        self._active = 0
        self._flush_lock = threading.Lock()
        self.presence = Presence(config, table_name, queue_url, self.stopping)
        self.presence.on_taken = lambda taken: self._die(f"{taken}: that process is this agent now; exiting")
        self.presence.on_error = self._gone

    # ------------------------------------------------------------------ fatal conditions
    def _die(self, reason: str) -> None:
        if self.fatal is None:
            self.fatal = reason
        self.stopping.set()

    def _gone(self, exc: BaseException | None) -> bool:
        """True (and the agent set to exit) when `exc` says the stack itself no longer exists."""
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            if code in _GONE:
                what = _GONE[code].format(table=self.table_name, queue=self.queue_url)
                self._die(f"the stack is gone: {what} does not exist ({code}); exiting so that a restart reads the stack file again")
                return True
        return False

    def _stack_identity(self) -> dict[str, str | None]:
        return {"endpoint": os.environ.get("AWS_ENDPOINT_URL"), "table": self.table_name, "queue": self.queue_url}

    def _stack_file_changed(self, seen: dict[str, Any]) -> None:
        """A stack file that now names another stack (the local stack restarted: new table, new
        ports): exit, so that the restart runs against the stack it names."""
        path = self.config.stack_file
        if path is None:
            return
        try:
            stat = path.stat().st_mtime_ns
            if seen.setdefault("mtime", stat) == stat:
                return
            seen["mtime"] = stat
            from relevo_agent.stackfile import load_stack

            stack = load_stack(path)
        except (OSError, ValueError):
            return  # being rewritten, or gone for a moment: look again next time
        now = {"endpoint": stack.aws_endpoint, "table": stack.table_name, "queue": stack.work_queues.get(self.config.region)}
        was = self._stack_identity()
        changed = [f"{name} {was[name]} -> {now[name]}" for name in now if now[name] != was[name]]
        if changed:
            self._die(f"the stack file {path} names another stack ({'; '.join(changed)}); exiting so that a restart uses it")

    # ------------------------------------------------------------------ loops
    def run(self) -> int:
        """Supervise until shut down; returns the process exit status: 0 after a clean stop,
        EXIT_AGENT_ID_IN_USE when another process runs with this agent_id, EXIT_STACK_GONE when
        the stack went away or this agent_id was taken over, 130 at the third signal."""
        try:
            self.presence.take(predecessor=self.journal.recall(INSTANCE_KEY))
            self.journal.remember(INSTANCE_KEY, self.presence.instance_id)
            self.recover()
        except AgentIdInUse as other:
            log.error("%s; not starting: stop it, or give this agent an agent_id of its own", other)
            return EXIT_AGENT_ID_IN_USE
        except (BotoCoreError, ClientError) as exc:
            if not self._gone(exc):
                raise
            log.error("%s", self.fatal)
            return EXIT_STACK_GONE
        self.journal.remember("stack", json.dumps({**self._stack_identity(), "at": _now().isoformat()}))
        poller = threading.Thread(target=self._poll, name="poll", daemon=True)
        flusher = threading.Thread(target=self._flush_outbox_loop, name="outbox", daemon=True)
        poller.start()
        flusher.start()
        canceled = False
        stack_file: dict[str, Any] = {}
        self._stack_file_changed(stack_file)  # notes the file as it is at the start
        checked = time.monotonic()
        while True:
            if self.fatal is not None:
                return self._exit_fatal()
            if time.monotonic() - checked >= STACK_FILE_CHECK_SEC:
                checked = time.monotonic()
                self._stack_file_changed(stack_file)
            if self.signals >= 3:
                log.warning("third signal: exiting now; the supervisors kill the running stages")
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

    def _exit_fatal(self) -> int:
        """One line says why; the running stages are stopped (their groups killed) first."""
        log.error("%s", self.fatal)
        with self._running_lock:
            for run in self._running.values():
                run.stop("shutdown")
        deadline = time.monotonic() + FATAL_STOP_WAIT_SEC
        while self._active and time.monotonic() < deadline:
            time.sleep(0.1)
        # The poll and presence loops end too: nothing of this agent outlives its exit (in a
        # process that lives on, such as a test's, they would go on polling and writing).
        self.stopping.set()
        self.presence.stop()
        return EXIT_STACK_GONE

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
                self._slots.release()
                if self._gone(exc):
                    return
                log.warning("receive failed (%s); retrying", exc)
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
        """Visible again at once ("ChangeMessageVisibility": VisibilityTimeout 0, the minimum)."""
        self._give_back_after(message["ReceiptHandle"], 0)

    def _give_back_after(self, receipt_handle: str, seconds: int, tries: int = 3) -> None:
        """Tried again after a transient error: a message left alone waits out the work queue's
        60 s visibility timeout, which a retry's queue timeout may not afford."""
        for attempt in range(tries):
            try:
                client("sqs").change_message_visibility(QueueUrl=self.queue_url, ReceiptHandle=receipt_handle, VisibilityTimeout=seconds)
                return
            except ClientError as exc:
                if exc.response["Error"]["Code"] == "ReceiptHandleIsInvalid":
                    return  # deleted meanwhile (the claim it led to did)
            except BotoCoreError:
                pass
            time.sleep(RETRY_AFTER_FAILURE_SEC * 2**attempt)
        log.warning("could not hand a stage message back; it returns after its visibility timeout")

    # ------------------------------------------------------------------ one stage
    def _handle(self, message: dict[str, Any]) -> None:
        try:
            task = StageMessage.model_validate_json(message["Body"])
        except ValidationError:
            log.error("unreadable stage message %s: left for the queue's redrive DLQ", message.get("MessageId"))
            self._release_slot()
            return
        what = f"{task.job_id}/{task.stage} attempt {task.attempt}"
        try:
            if self.presence.leave_to_another(task.avoid_agents, task.queue_timeout_sec, message, what):
                return
            with self.presence.occupied():
                self._run_stage(task, message)
        except HandBack as why:
            if self._gone(why.__cause__):
                return
            log.warning("%s: %s; handing the message back", what, why)
            self._give_back(message)
        except Exception:
            log.exception("stage %s crashed in the agent; handing the message back", what)
            self._give_back(message)
        finally:
            self._release_slot()

    def _release_slot(self) -> None:
        with self._running_lock:
            self._active -= 1
        self._slots.release()

    def _run_stage(self, task: StageMessage, message: dict[str, Any]) -> None:
        receipt_handle = message["ReceiptHandle"]
        envelope = self._envelope(task, receipt_handle)
        if envelope is None:
            return
        plan = envelope.stage(task.stage)
        timeline = LeaseTimeline(envelope.lease_ttl_sec, plan.kill_grace_sec, self.config.max_clock_skew_sec)
        op_id = operation_id(task.job_id, task.stage)
        if not timeline.feasible:
            log.error(
                "%s: a lease of %ds leaves no renewal before the fence with max_clock_skew_sec %g and kill grace %ds; "
                "not taking it (raise the project's lease_ttl_sec)", op_id, envelope.lease_ttl_sec,
                self.config.max_clock_skew_sec, plan.kill_grace_sec,
            )
            raise HandBack("the lease is too short for this agent")
        ref = stage_attempts.StageRef(self.table_name, task.job_id, task.stage_index, task.attempt, self.config.agent_id)
        if op_id in self._running:
            # A second delivery of a message this agent already claimed: the claim decides.
            log.info("%s is already running here; duplicate message dropped", op_id)
            self._delete_message(receipt_handle)
            return
        workspace = self.config.workspace_root / envelope.project
        precondition = reconcile.precondition_version(workspace, envelope.ref, envelope.commit, plan.inputs)
        local = self.journal.get(op_id)
        # Journaled before the claim: every attempt this agent may hold is in its journal.
        self.journal.begin(Operation(op_id, task.job_id, task.stage, task.stage_index, task.attempt, str(workspace), precondition))
        claim_sent = time.monotonic()
        try:
            previous = self._claim(ref, timeline, precondition, sent_at(message))
        except stage_attempts.ClaimRefused as refused:
            self.journal.record(op_id, ref.attempt, Outcome.ABANDONED, None, None)
            self._refused(op_id, ref, refused, receipt_handle)
            return
        except (BotoCoreError, ClientError) as exc:
            self.journal.record(op_id, ref.attempt, Outcome.ABANDONED, None, None)
            raise HandBack(f"the claim did not go through ({exc})") from exc
        log.info("claimed %s attempt %d", op_id, ref.attempt)
        # From the claim on, the lease is kept and fenced beside whatever this thread does: the
        # answer to the dispatch, the wait for the previous holder, the probe, the command.
        run = StageRun(ref, Lease(timeline, claim_sent), exec_deadline=claim_sent + plan.exec_timeout_sec)
        with self._running_lock:
            self._running[op_id] = run
        keepers = [
            threading.Thread(target=self._keep_lease, args=(run, op_id), name="lease", daemon=True),
            threading.Thread(target=self._fence, args=(run, op_id), name="fence", daemon=True),
        ]
        for keeper in keepers:
            keeper.start()
        try:
            accepted = self._accept(run, task.task_token)
            if accepted is False:
                run.stop("not_taken")
                self._delete_message(receipt_handle)
                self._abandon(run, op_id)
                return
            # The state machine has taken this claim as the dispatch's answer (or may have: then
            # the run token it hands out decides): the stage starts now. The message and the run
            # token are seen to beside it (_watch_for_run_token).
            watcher = threading.Thread(target=self._watch_for_run_token, args=(run, op_id, receipt_handle), name="token", daemon=True)
            watcher.start()
            keepers.append(watcher)
            env = self._stage_env(envelope, task, workspace)
            if accepted is None and not self._taken(run, op_id):
                self._abandon(run, op_id)
                return
            if stage_attempts.needs_reconcile(previous, ref.attempt):
                if not self._after_previous_fence(run, op_id, previous):
                    self._abandon(run, op_id)
                    return
                if not self._reconcile(run, plan, op_id, local, previous, precondition, workspace, env):
                    return
            self._execute(run, plan, op_id, workspace, env, envelope)
        finally:
            run.done.set()
            for keeper in keepers:
                keeper.join(timeout=5)
            with self._running_lock:
                self._running.pop(op_id, None)

    def _envelope(self, task: StageMessage, receipt_handle: str) -> JobEnvelope | None:
        """The job's envelope. A job that is gone or unreadable fails the dispatch for good; a
        network fault hands the message back."""
        try:
            return get_envelope(self.table_name, task.job_id)
        except RelevoError as exc:
            try:
                client("stepfunctions").send_task_failure(taskToken=task.task_token, error=exc.code.value, cause=exc.message)
            except (BotoCoreError, ClientError) as failure:
                raise HandBack(f"the dispatch could not be failed ({failure})") from failure
            self._delete_message(receipt_handle)
            return None
        except (BotoCoreError, ClientError) as exc:
            raise HandBack(f"the envelope could not be read ({exc})") from exc

    def _claim(
        self, ref: stage_attempts.StageRef, timeline: LeaseTimeline, precondition: str, enqueued_at: datetime | None
    ) -> dict[str, Any]:
        """The claim, sent again with the same claim id after a transient error (a reset may
        have lost the answer of a claim that landed), for as long as the lease could still be
        kept afterwards."""
        claim_id, now = uuid.uuid4().hex, _now()
        give_up = time.monotonic() + max(0.0, timeline.fence_after_sec - timeline.renew_interval_sec)
        delay = RETRY_AFTER_FAILURE_SEC
        while True:
            try:
                return stage_attempts.claim(
                    ref, int(timeline.lease_ttl_sec), now, precondition, enqueued_at, claim_id, self.journal.journal_id
                )
            except stage_attempts.ClaimRefused:
                raise
            except (BotoCoreError, ClientError) as exc:
                if time.monotonic() + delay > give_up:
                    raise
                log.warning("%s/%d: claim failed (%s); sending it again", ref.job_id, ref.stage_index, exc)
                time.sleep(delay)
                delay = min(2 * delay, 2.0)

    def _refused(self, op_id: str, ref: stage_attempts.StageRef, refused: stage_attempts.ClaimRefused, receipt_handle: str) -> None:
        found = refused.item
        if refused.held:
            # A redelivery while the holder's lease lives: back when that lease would have ended.
            log.info("%s attempt %d is held by %s; its message returns when that lease would end", op_id, ref.attempt, found.get("agent_id"))
            back_in = int(found.get("lease_expires_at", 0)) - int(_now().timestamp()) + 1
            self._give_back_after(receipt_handle, min(60, max(1, back_in)))
            return
        log.info(
            "%s attempt %d is over (%s attempt %s, %s): its message is deleted",
            op_id, ref.attempt, found.get("status"), found.get("attempt"), found.get("agent_id"),
        )
        self._delete_message(receipt_handle)

    def _taken(self, run: StageRun, op_id: str) -> bool:
        """After an accept whose answer was lost: the state machine took the claim if it hands
        this attempt its run token (the keeper looks)."""
        run.token_known.wait(RUN_TOKEN_WAIT_SEC + 5)
        if run.run_token and run.reason is None:
            log.info("%s attempt %d: the state machine took the claim after all", op_id, run.ref.attempt)
            return True
        return False

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
            result = self._run(run, plan, plan.effect_probe, workspace, {**env, "RELEVO_PROBE": "1"}, lambda chunk: None, probe=True)
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
        )
        self.journal.set_process_group(op_id, run.ref.attempt, None)
        if run.reason is None and run.lease.fenced(result.ended_at):
            # Its supervisor got there first (this agent was frozen, or slow to see the deadline).
            log.warning("%s attempt %d: the command ended at the lease fence; its result is withheld", op_id, run.ref.attempt)
            run.stop("fenced")
        return result

    def _execute(
        self, run: StageRun, plan: StagePlan, op_id: str, workspace: Path, env: dict[str, str], envelope: JobEnvelope
    ) -> None:
        ref = run.ref
        if run.reason is not None:  # stopped while reconciling or waiting
            self._abandon(run, op_id)
            return
        # Log shipping (relevo_agent.logs): masked, ordered chunks, never blocking the command,
        # each expiring when the job's envelope says (the stack's log retention).
        shipper = start_shipper(ref, plan.name, self.config, env, envelope.log_expires_at)
        try:
            result = self._run(run, plan, plan.command, workspace, env, shipper.write)
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
        cause = {"exit_code": result.exit_code, "agent_id": self.config.agent_id, "attempt": ref.attempt}
        if result.signaled and not result.timed_out:
            # Killed by a signal this agent did not send (an operator, the OOM killer): what it had
            # done is unknown, so it is retried and the retry reconciles before it runs anything.
            cause["killed_by_signal"] = result.signaled
            self._conclude(
                run, op_id, StageStatus.FAILED, Outcome.FAILED, receipt, exit_code=result.exit_code,
                error=ErrorClass.TRANSIENT_EXIT, cause=json.dumps(cause), stage_outcome=stage_attempts.Outcome.UNKNOWN,
            )
            log.warning("%s was killed by signal %d, not by this agent: retried, reconciled first", op_id, result.signaled)
            return
        error = artifact_error or classify(result.exit_code, result.output_tail, plan.retry, result.timed_out)
        self._conclude(
            run, op_id, StageStatus.FAILED, Outcome.FAILED, receipt, exit_code=result.exit_code, error=error, cause=json.dumps(cause),
        )
        log.info("%s failed: %s (exit %d)", op_id, error.value, result.exit_code)

    def _stopped(self, run: StageRun, op_id: str, exit_code: int) -> None:
        """The command was stopped before its end: by a shutdown (reported, retryable, outcome
        unknown so the retry reconciles), fenced (the lease deadline came: killed, result
        withheld), or taken over or canceled (nothing claimed: another attempt may own the stage)."""
        if run.reason == "shutdown":
            self._conclude(
                run, op_id, StageStatus.FAILED, Outcome.ABANDONED, None, exit_code=exit_code,
                error=ErrorClass.AGENT_SHUTDOWN, cause="the agent was shut down while the stage ran",
                stage_outcome=stage_attempts.Outcome.UNKNOWN,
            )
            return
        if run.reason == "fenced":
            log.warning("%s attempt %d fenced: killed at the lease deadline less the margin; result withheld", op_id, run.ref.attempt)
            self.journal.record(op_id, run.ref.attempt, Outcome.FENCED, None, None)
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
            # Nothing of this attempt runs any more here: its lease ends with the report.
            "lease_ended": True,
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
                lease_ended=bool(report.get("lease_ended")),
            )
        except stage_attempts.LeaseLost:
            log.warning("%s:%s attempt %d: report refused, another attempt holds the stage", report["job_id"], report["stage"], report["attempt"])
            return True
        except (BotoCoreError, ClientError) as exc:
            self._gone(exc)
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
        """Restart: every operation the journal shows in flight was interrupted (its supervisor
        killed the command when the agent died). Each is reported failed with cause
        agent_restart_interrupted and outcome unknown: Relevo.Transient.AgentShutdown is
        retryable, and the next attempt reconciles before it runs anything. The report ends the
        attempt's lease only once its process group is seen gone, so a successor never probes
        beside a command still dying. Reports left in the outbox are sent.

        Attempts Relevo records as held by this agent_id that the journal does not know are taken
        over only when this journal claimed them; any other (a lost journal, or another Mac
        running with this agent_id) is left to its lease, which its own holder fences."""
        for op in self.journal.in_flight():
            log.warning("restart: %s attempt %d was in flight; reporting it interrupted", op.operation_id, op.attempt)
            self._interrupted(op, lease_ended=_group_gone(op.pgid))
        try:
            held = stage_attempts.held_by(self.table_name, self.config.agent_id)
        except (BotoCoreError, ClientError) as exc:
            if isinstance(exc, ClientError) and exc.response["Error"]["Code"] in _GONE:
                raise
            log.warning("restart: cannot list the attempts this agent holds (%s); their leases will expire", exc)
            held = []
        for attempt in held:
            job_id, stage = attempt.job_id, attempt.stage_name
            known = self.journal.get(operation_id(job_id, stage))
            if known is not None and known.attempt == attempt.attempt:
                continue
            if attempt.journal_id != self.journal.journal_id:
                log.warning(
                    "restart: %s:%s attempt %s is held by agent_id %s but was claimed from another journal; left to its lease",
                    job_id, stage, attempt.attempt, self.config.agent_id,
                )
                continue
            log.warning("restart: %s:%s attempt %s was claimed from this journal but is not in it; failing it", job_id, stage, attempt.attempt)
            op = Operation(
                operation_id(job_id, stage), job_id, stage, attempt.stage_index, attempt.attempt, "", "",
                run_token=attempt.run_token,
            )
            self.journal.begin(op)
            self._interrupted(op, lease_ended=False)
        self.flush_outbox()

    def _interrupted(self, op: Operation, lease_ended: bool) -> None:
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
            "lease_ended": lease_ended,
        }
        self.journal.record(op.operation_id, op.attempt, Outcome.ABANDONED, None, report)

    # ------------------------------------------------------------------ claim handshake and lease
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
                if code in _DEAD_TOKEN:
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
            if check_job and JobStatus(get_job_record(self.table_name, ref.job_id)["status"]).terminal:
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

    def _watch_for_run_token(self, run: StageRun, op_id: str, receipt_handle: str) -> None:
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
                            self._delete_message(receipt_handle)
                    return
        finally:
            run.token_known.set()  # whoever waits for the token is not left waiting

    def _keep_lease(self, run: StageRun, op_id: str) -> None:
        """Beside the stage, from the claim on: renew the lease, and heartbeat the task once the
        run token is known, every min(lease/3, 3 s). Each round is bounded by the time left
        before the fence, and only a round that came back extends the lease, from when it was
        sent. The fence itself is not this thread's: _fence keeps it even while a call hangs."""
        ref, lease = run.ref, run.lease
        interval = lease.timeline.renew_interval_sec
        # Due one interval after the claim was sent (the lease counts from there), not after
        # this thread happened to start.
        renew_at = lease.deadline - lease.timeline.lease_ttl_sec + interval
        while not run.done.wait(max(0.0, renew_at - time.monotonic())):
            if run.reason is not None:
                return
            sent = time.monotonic()
            if lease.fenced(sent):
                return  # too late to renew: _fence has stopped the command
            try:
                with call_budget(lease.fence_at - sent):
                    stage_attempts.renew_lease(ref, int(lease.timeline.lease_ttl_sec), _now())
                    if run.run_token:
                        client("stepfunctions").send_task_heartbeat(taskToken=run.run_token)
                lease.extend(sent)
                renew_at = sent + interval
                continue
            except stage_attempts.LeaseLost as lost:
                if lost.ended:
                    log.warning("%s stage %d: canceled with its job; stopping the stage", ref.job_id, ref.stage_index)
                    run.stop("canceled")
                else:
                    log.warning("%s stage %d: lease taken over; stopping the stage", ref.job_id, ref.stage_index)
                    run.stop("lease_lost")
                return
            except ClientError as exc:
                if exc.response["Error"]["Code"] in _DEAD_TOKEN:
                    log.warning("%s stage %d: the execution no longer waits for it; stopping", ref.job_id, ref.stage_index)
                    run.stop("canceled")
                    return
                if self._gone(exc):
                    run.stop("shutdown")
                    return
                why = exc.response["Error"]["Code"]
            except BotoCoreError as exc:
                why = str(exc)
            log.warning("%s: renewal failed (%s); %.1fs left before the fence", op_id, why, lease.fence_in())
            renew_at = time.monotonic() + RETRY_AFTER_FAILURE_SEC

    def _fence(self, run: StageRun, op_id: str) -> None:
        """At the lease deadline less the fence margin, by this process's monotonic clock, the
        stage's command is stopped and its result withheld, whatever the network is doing. A
        renewal that came back meanwhile has moved the fence; the wait follows it."""
        lease = run.lease
        while not run.done.wait(max(0.01, lease.fence_in())):
            if lease.fenced():
                log.warning(
                    "%s attempt %d: no renewal came back in time; fencing (SIGTERM now, SIGKILL after %.1fs)",
                    op_id, run.ref.attempt, lease.grace_sec,
                )
                run.stop("fenced")
                return


# How long a restarted agent waits for an interrupted command's group to be gone (its supervisor
# SIGTERMs it when the agent dies and SIGKILLs it after the stage's kill grace).
RESTART_GROUP_WAIT_SEC = 30.0


def _group_gone(pgid: int | None, wait_sec: float = RESTART_GROUP_WAIT_SEC) -> bool:
    """Whether the process group is gone, waiting for it up to `wait_sec`. Unknown (no group
    journaled: the command had not started, or the journal is older) counts as not known gone."""
    if pgid is None:
        return False
    deadline = time.monotonic() + wait_sec
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # another user's group now: not ours to wait for, and not known gone
        if time.monotonic() >= deadline:
            log.warning("restart: process group %d is still there; the attempt's lease is left to run out", pgid)
            return False
        time.sleep(0.1)


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
