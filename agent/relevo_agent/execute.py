"""The stage's command on this agent, under its attempt's lease: its environment, a temporary
signing keychain when the plan signs, its values ($RELEVO_OUTPUT) journaled and recorded as they
come, the command in its own process group (relevo_agent.executor) with its dead-man supervisor
following the lease, then its artifacts and handoff stored; concluded with its receipt
(relevo_agent.conclude).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relevo_agent import warning_lines
from relevo_agent.attempt import StageMessage, StageRun
from relevo_agent.classify import classify
from relevo_agent.conclude import Concluder
from relevo_agent.config import AgentConfig
from relevo_agent.executor import ExecResult, run_command
from relevo_agent.journal import Journal, OperationOutcome, operation_id
from relevo_agent.keychain import KeychainFailure, Keychains, read_identities
from relevo_agent.logs import secret_values
from relevo_agent.stage_env import stage_environment
from relevo_agent.warning_lines import WarningLines
from relevo_core.aws import call_budget
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.prepare import Prepared
    from relevo_core.models.envelope import JobEnvelope
    from relevo_core.models.plan import StagePlan

log = logging.getLogger(__name__)


class StageCommand:
    """`keychains`: this agent's temporary signing keychains (relevo_agent.keychain)."""

    def __init__(
        self, config: AgentConfig, journal: Journal, keychains: Keychains, concluder: Concluder
    ) -> None:
        self.config = config
        self.journal = journal
        self.keychains = keychains
        self.concluder = concluder

    def environment(
        self, envelope: JobEnvelope, task: StageMessage, workspace: Path, prepared: Prepared
    ) -> dict[str, str]:
        # Made after the checkout (its git clean would remove it), inside the workspace as ever.
        artifact_dir = workspace / ".relevo-artifacts" / task.job_id / task.stage
        if task.shard is not None:
            artifact_dir = artifact_dir / f"shard-{task.shard}"
        artifact_dir.mkdir(parents=True, exist_ok=True)
        plan = envelope.stage(task.stage)
        # A shard's index and count, and its matrix values (StagePlan.shards).
        shard = plan.shards()[task.shard].environment() if task.shard is not None and plan.sharded else {}
        relevo = {
            "RELEVO_JOB_ID": task.job_id,
            "RELEVO_STAGE": task.stage,
            "RELEVO_ATTEMPT": str(task.attempt),
            "RELEVO_OPERATION_ID": operation_id(task.job_id, task.stage, task.shard),
            "RELEVO_WORKSPACE": str(workspace),
            "RELEVO_ARTIFACT_DIR": str(artifact_dir),
            "RELEVO_REF": envelope.ref,
            # The commit, and every earlier stage's values (RELEVO_OUT_<STAGE>_<KEY>).
            **prepared.variables,
            # A workspace is never taken for part of a repository around it: git in a stage looks
            # no higher than the workspace root (without a checkout the workspace is no repository).
            "GIT_CEILING_DIRECTORIES": str(self.config.workspace_root),
            **shard,
        }
        # Never the agent's credentials (relevo_agent.stage_env).
        return stage_environment(os.environ, relevo, plan.aws_profile)

    def under_lease(
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
        op_id = operation_id(run.ref.job_id, plan.name, run.ref.shard)
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
            log.warning(
                "%s attempt %d: the command ended at the lease fence; its result is withheld",
                op_id,
                run.ref.attempt,
            )
            run.stop("fenced")
        return result

    def execute(
        self,
        run: StageRun,
        plan: StagePlan,
        op_id: str,
        workspace: Path,
        env: dict[str, str],
        envelope: JobEnvelope,
        shipper: Any,
        prepared: Prepared,
    ) -> None:
        """The stage's command, then what it left (values, artifacts, handoff), to its conclusion."""
        from relevo_agent.artifacts import upload_stage_artifacts
        from relevo_agent.outputs import OutputInvalid, OutputWatch

        ref = run.ref
        if run.reason is not None:  # stopped while reconciling or waiting
            self.concluder.abandon(run, op_id)
            return
        keychain = None
        if envelope.signing is not None:
            try:
                self.keychains.require()  # on an agent that cannot, before any secret is read
                identities = read_identities(envelope.signing)
                keychain = self.keychains.create(
                    f"{ref.job_id}.{plan.name}.{ref.attempt}", identities, plan.exec_timeout_sec
                )
            except KeychainFailure as failure:
                log.warning("%s attempt %d: no signing keychain: %s", op_id, ref.attempt, failure.message)
                cause: dict[str, Any] = {
                    "keychain": failure.message,
                    "agent_id": self.config.agent_id,
                    "attempt": ref.attempt,
                }
                self.concluder.conclude(
                    run,
                    op_id,
                    StageStatus.FAILED,
                    OperationOutcome.FAILED,
                    None,
                    error=failure.error_class,
                    cause=json.dumps(cause),
                )
                return
            env = {**env, "RELEVO_KEYCHAIN": str(keychain)}
        # The stage's values ($RELEVO_OUTPUT, relevo_agent.outputs): journaled, then recorded
        # (fenced) as each line completes, beside the command.
        watch = OutputWatch.create(
            self.config.workspace_root / ".relevo-outputs" / f"{ref.job_id}.{plan.name}.{ref.attempt}",
            secret_values(self.config.mask, env),
            lambda values, changed: self._outputs_changed(run, op_id, shipper, values, changed),
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
            result = self.under_lease(run, plan, plan.command, workspace, env, warnings.write)
            ended_well = warning_lines.ended_well(plan, result.exit_code)
            try:
                outputs = watch.stop()
            except OutputInvalid as invalid:
                outputs, error, why = dict(watch.parser.values), ErrorClass.OUTPUT_INVALID, str(invalid)
            # Artifacts (relevo_agent.artifacts), then the handoff: stored after success while the
            # lease is still kept, each record fenced on the attempt.
            if ended_well and run.reason is None and error is None:
                error = upload_stage_artifacts(
                    ref,
                    plan.name,
                    Path(env["RELEVO_ARTIFACT_DIR"]),
                    envelope,
                    self.config,
                    shipper,
                    run.cancel,
                    run.transfer,
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
            self.concluder.stopped(run, op_id, result.exit_code)
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
            self.concluder.conclude(
                run, op_id, status, OperationOutcome.SUCCEEDED, receipt, exit_code=result.exit_code
            )
            log.info(
                "%s %s in %.1fs",
                op_id,
                "succeeded with warnings" if warned else "succeeded",
                result.duration_sec,
            )
            return
        cause = {
            "exit_code": result.exit_code,
            "agent_id": self.config.agent_id,
            "attempt": ref.attempt,
        }
        if why:
            cause["why"] = why
            shipper.line(f"[relevo] {error.value if error else ''}: {why}")
        if result.signaled and not result.timed_out:
            # Killed by a signal this agent did not send (an operator, the OOM killer): what it had
            # done is unknown, so it is retried and the retry reconciles before it runs anything.
            cause["killed_by_signal"] = result.signaled
            self.concluder.conclude(
                run,
                op_id,
                StageStatus.FAILED,
                OperationOutcome.FAILED,
                receipt,
                exit_code=result.exit_code,
                error=ErrorClass.TRANSIENT_EXIT,
                cause=json.dumps(cause),
                stage_outcome=stage_attempts.AttemptOutcome.UNKNOWN,
            )
            log.warning(
                "%s was killed by signal %d, not by this agent: retried, reconciled first",
                op_id,
                result.signaled,
            )
            return
        error = error or classify(result.exit_code, result.output_tail, plan.retry, result.timed_out)
        self.concluder.conclude(
            run,
            op_id,
            StageStatus.FAILED,
            OperationOutcome.FAILED,
            receipt,
            exit_code=result.exit_code,
            error=error,
            cause=json.dumps(cause),
        )
        log.info("%s failed: %s (exit %d)", op_id, error.value, result.exit_code)

    def _outputs_changed(
        self, run: StageRun, op_id: str, shipper: Any, values: dict[str, str], changed: list[str]
    ) -> None:
        """New values of the command's: journaled first, then recorded on the stage, fenced."""
        ref = run.ref
        self.journal.set_outputs(op_id, ref.attempt, values)
        for key in changed:
            shown = values[key] if len(values[key]) <= 200 else values[key][:200] + "…"
            shipper.line(
                f"[relevo] output {key}={shown}"
                if "\n" not in shown
                else f"[relevo] output {key} ({values[key].count(chr(10)) + 1} lines)"
            )
        try:
            with call_budget(min(5.0, max(0.5, run.lease.fence_in()))):
                stage_attempts.record_outputs(ref, values)
        except stage_attempts.LeaseLost:
            log.warning(
                "%s attempt %d: its values were refused: the attempt is no longer held", op_id, ref.attempt
            )

    def _store_handoff(
        self,
        run: StageRun,
        plan: StagePlan,
        workspace: Path,
        envelope: JobEnvelope,
        shipper: Any,
        prepared: Prepared,
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
                ref,
                plan.name,
                workspace,
                plan.handoff,
                envelope.artifact_uri,
                envelope.ttl,
                prepared.known,
                handoff_cache(self.config),
                emit,
                run.cancel,
                max_job_bytes=envelope.artifact_max_job_bytes,
                bucket_region=region,
                crosses_region=None if location is None or not region else region != location,
            )
        except HandoffFailure as failure:
            return None, failure.error_class, failure.message
        except stage_attempts.LeaseLost:
            emit("[relevo] handoff records refused: the attempt is no longer held")
            run.stop("lease_lost")
            return None, None, None
        return summary.model_dump(mode="json"), None, None


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
