"""The agent's loops: poll while there is free capacity; per stage, claim, keep the lease and
the task heartbeat alive on their own ticker, run, record, report."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, ValidationError

from relevo_agent.classify import classify
from relevo_agent.config import AgentConfig
from relevo_agent.artifacts import upload_stage_artifacts
from relevo_agent.executor import run_command
from relevo_agent.logs import start_shipper
from relevo_core.aws import client
from relevo_core.models.errors import ErrorClass, RelevoError
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts
from relevo_core.store.jobs import get_envelope

log = logging.getLogger("relevo_agent")


class StageMessage(BaseModel):
    """What the state machine puts on a region's work queue."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str
    stage: str
    stage_index: int
    attempt: int  # 1, 2, ...: the fencing token of this attempt
    task_token: str  # answers the dispatch (the claim); the run has a token of its own


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Agent:
    def __init__(self, config: AgentConfig, table_name: str, queue_url: str) -> None:
        self.config = config
        self.table_name = table_name
        self.queue_url = queue_url
        self.stopping = threading.Event()
        self._slots = threading.Semaphore(config.capacity)
        self._pool = ThreadPoolExecutor(max_workers=config.capacity, thread_name_prefix="stage")

    # ------------------------------------------------------------------ loops
    def run(self) -> None:
        log.info("agent %s polling %s (capacity %d)", self.config.agent_id, self.queue_url, self.config.capacity)
        sqs = client("sqs")
        while not self.stopping.is_set():
            if not self._slots.acquire(timeout=0.5):
                continue  # no free capacity: do not take work we cannot start
            try:
                response = sqs.receive_message(
                    QueueUrl=self.queue_url, MaxNumberOfMessages=1, WaitTimeSeconds=self.config.poll_wait_sec
                )
            except ClientError:
                log.exception("receive failed; retrying")
                self._slots.release()
                self.stopping.wait(1)
                continue
            messages = response.get("Messages", [])
            if not messages:
                self._slots.release()
                continue
            future = self._pool.submit(self._handle, messages[0])
            future.add_done_callback(lambda _: self._slots.release())
        self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ one stage
    def _handle(self, message: dict[str, Any]) -> None:
        try:
            task = StageMessage.model_validate_json(message["Body"])
        except ValidationError:
            log.error("unreadable stage message %s: left for the queue's redrive DLQ", message.get("MessageId"))
            return
        try:
            self._run_stage(task, message["ReceiptHandle"])
        except Exception:
            log.exception("stage %s/%s crashed in the agent", task.job_id, task.stage)

    def _run_stage(self, task: StageMessage, receipt_handle: str) -> None:
        sfn = client("stepfunctions")
        try:
            envelope = get_envelope(self.table_name, task.job_id)
        except RelevoError as exc:
            sfn.send_task_failure(taskToken=task.task_token, error=exc.code.value, cause=exc.message)
            client("sqs").delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt_handle)
            return
        plan = envelope.stage(task.stage)
        ref = stage_attempts.StageRef(
            table=self.table_name,
            job_id=task.job_id,
            stage_index=task.stage_index,
            attempt=task.attempt,
            agent_id=self.config.agent_id,
        )
        try:
            stage_attempts.claim(ref, envelope.lease_ttl_sec, _now())
        except stage_attempts.LeaseLost:
            log.info("%s/%s attempt %d is held by another agent", task.job_id, task.stage, ref.attempt)
            return
        # The claim is the durable record now; the message has done its job.
        client("sqs").delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt_handle)
        log.info("claimed %s/%s attempt %d", task.job_id, task.stage, ref.attempt)
        run_token = self._accept(ref, task.task_token)
        if run_token is None:
            return

        cancel = threading.Event()
        keeper = threading.Thread(
            target=self._keep_lease, args=(ref, run_token, envelope.lease_ttl_sec, cancel), daemon=True
        )
        keeper.start()
        workspace = self.config.workspace_root / envelope.project
        artifact_dir = workspace / ".relevo-artifacts" / task.job_id / task.stage
        artifact_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "RELEVO_JOB_ID": task.job_id,
            "RELEVO_STAGE": task.stage,
            "RELEVO_ATTEMPT": str(ref.attempt),
            "RELEVO_OPERATION_ID": f"{task.job_id}:{task.stage}",
            "RELEVO_WORKSPACE": str(workspace),
            "RELEVO_ARTIFACT_DIR": str(artifact_dir),
            "RELEVO_REF": envelope.ref,
            "RELEVO_COMMIT": envelope.commit or "",
        }
        # Log shipping (relevo_agent.logs): masked, ordered chunks, never blocking the command.
        shipper = start_shipper(ref, task.stage, self.config, env)
        result = run_command(
            plan.command,
            workspace,
            env,
            timeout_sec=plan.exec_timeout_sec,
            cancel=cancel,
            on_output=shipper.write,
            grace_sec=plan.kill_grace_sec,
        )
        # Artifacts (relevo_agent.artifacts): uploaded after success while the lease is still kept.
        artifact_error = None
        if result.exit_code == 0 and not cancel.is_set():
            artifact_error = upload_stage_artifacts(
                ref, task.stage, artifact_dir, envelope.artifact_uri, self.config, shipper, cancel
            )
        shipper.close()
        lease_lost = cancel.is_set()
        cancel.set()  # stops the keeper
        keeper.join(timeout=5)
        if lease_lost:
            # Fenced: another attempt may own the stage now; report nothing as succeeded.
            log.warning("%s/%s attempt %d lost its lease; result withheld", task.job_id, task.stage, ref.attempt)
            return
        if result.exit_code == 0 and artifact_error is None:
            self._finish(ref, StageStatus.SUCCEEDED, result.exit_code, None, task.stage)
            sfn.send_task_success(
                taskToken=run_token,
                output=json.dumps({"stage": task.stage, "attempt": ref.attempt, "agent_id": self.config.agent_id}),
            )
            log.info("%s/%s succeeded in %.1fs", task.job_id, task.stage, result.duration_sec)
            return
        error = artifact_error or classify(result.exit_code, result.output_tail, plan.retry, result.timed_out)
        self._finish(ref, StageStatus.FAILED, result.exit_code, error)
        sfn.send_task_failure(
            taskToken=run_token,
            error=error.value,
            cause=json.dumps({"exit_code": result.exit_code, "agent_id": self.config.agent_id, "attempt": ref.attempt}),
        )
        log.info("%s/%s failed: %s (exit %d)", task.job_id, task.stage, error.value, result.exit_code)

    def _accept(self, ref: stage_attempts.StageRef, dispatch_token: str, wait_sec: float = 30) -> str | None:
        """Tell the state machine who claimed the stage, then wait for the run token it hands to
        exactly that claim. The queue wait ends here; the lease clock starts."""
        sfn = client("stepfunctions")
        try:
            sfn.send_task_success(
                taskToken=dispatch_token, output=json.dumps({"agent_id": self.config.agent_id, "attempt": ref.attempt})
            )
        except ClientError as exc:
            log.warning("%s/%d: the dispatch is no longer waiting (%s)", ref.job_id, ref.stage_index, exc.response["Error"]["Code"])
            return None
        deadline = time.monotonic() + wait_sec
        while time.monotonic() < deadline and not self.stopping.is_set():
            try:
                token = stage_attempts.run_token(ref)
            except stage_attempts.LeaseLost:
                return None
            if token:
                return token
            time.sleep(0.05)
        log.warning("%s/%d: no run token after %.0fs", ref.job_id, ref.stage_index, wait_sec)
        return None

    def _finish(
        self, ref: stage_attempts.StageRef, status: StageStatus, exit_code: int, error: ErrorClass | None, stage: str | None = None
    ) -> None:
        try:
            stage_attempts.finish(ref, status, _now(), exit_code, error.value if error else None, stage)
        except stage_attempts.LeaseLost:
            log.warning("%s stage %d: record refused, another attempt holds it", ref.job_id, ref.stage_index)

    def _keep_lease(self, ref: stage_attempts.StageRef, token: str, lease_ttl_sec: int, done: threading.Event) -> None:
        """Renew the lease and heartbeat the task every lease/3, apart from the work itself."""
        interval = max(1.0, lease_ttl_sec / 3)
        while not done.wait(interval):
            try:
                stage_attempts.renew_lease(ref, lease_ttl_sec, _now())
                client("stepfunctions").send_task_heartbeat(taskToken=token)
            except stage_attempts.LeaseLost:
                log.warning("%s stage %d: lease taken over; stopping the stage", ref.job_id, ref.stage_index)
                done.set()
                return
            except ClientError as exc:
                if exc.response["Error"]["Code"] in ("TaskTimedOut", "TaskDoesNotExist", "InvalidToken"):
                    log.warning("%s stage %d: the execution no longer waits for it; stopping", ref.job_id, ref.stage_index)
                    done.set()
                    return
                log.warning("heartbeat failed (%s); will retry", exc.response["Error"]["Code"])
