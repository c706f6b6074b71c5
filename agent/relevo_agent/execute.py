"""The stage's command on this agent, under its attempt's lease, step by step: its environment, a
temporary signing keychain when the plan signs (a context manager), its values ($RELEVO_OUTPUT)
journaled and recorded as they come, the command in its own process group (relevo_agent.executor)
with its dead-man supervisor following the lease, then its artifacts and handoff stored; its ending
made of its receipt (relevo_agent.receipt), for the one conclusion (relevo_agent.conclude).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relevo_agent import warning_lines
from relevo_agent.attempt import StageMessage, StageRun
from relevo_agent.config import AgentConfig
from relevo_agent.ending import Ended, Ending
from relevo_agent.executor import ExecResult, run_command
from relevo_agent.journal import Journal, operation_id
from relevo_agent.keychain import KeychainFailure, Keychains, read_identities
from relevo_agent.logs import Masker, secret_values
from relevo_agent.receipt import Ran, WhatItLeft, ending_of
from relevo_agent.shard_tests import checked, for_shard
from relevo_agent.stage_caches import restore_stage_caches, save_stage_caches
from relevo_agent.stage_env import stage_environment
from relevo_agent.stage_handoff import store_stage_handoff
from relevo_agent.test_reports import read_stage_reports
from relevo_agent.warning_lines import WarningLines
from relevo_core.aws import call_budget
from relevo_core.models.errors import ErrorClass
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.claim_routes import ClaimRoutes
    from relevo_agent.effects.kind import EffectContext
    from relevo_agent.outputs import OutputWatch
    from relevo_agent.prepare import Prepared
    from relevo_agent.reconcile import Resumption
    from relevo_core.models.capabilities import Capabilities
    from relevo_core.models.envelope import JobEnvelope
    from relevo_core.models.plan import StagePlan

log = logging.getLogger(__name__)


class StageCommand:
    """`keychains`: this agent's temporary signing keychains (relevo_agent.keychain)."""

    def __init__(
        self, config: AgentConfig, journal: Journal, keychains: Keychains, routes: ClaimRoutes | None = None
    ) -> None:
        self.config = config
        self.journal = journal
        self.keychains = keychains
        # What this Mac detected at the agent's start (relevo_agent.capabilities): a cache key's facts.
        self.capabilities: Capabilities | None = None
        # The region's claim routes: a shard asks there for its stage's test plan.
        self.routes = routes

    def restore_caches(
        self,
        run: StageRun,
        plan: StagePlan,
        envelope: JobEnvelope,
        workspace: Path,
        prepared: Prepared,
        emit: Any,
    ) -> None:
        """The stage's caches restored before its command (relevo_agent.stage_caches)."""
        restore_stage_caches(self.config, self.capabilities, run, plan, envelope, workspace, prepared, emit)

    def environment(
        self,
        envelope: JobEnvelope,
        task: StageMessage,
        workspace: Path,
        prepared: Prepared,
        build_number: int | None = None,
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
        if build_number is not None:
            # The job's, as its claim's answer brought it (relevo_core.fleet.build_numbers): a
            # stage's environment, not a secret; the same on every attempt, stage and shard.
            relevo["RELEVO_BUILD_NUMBER"] = str(build_number)
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
        resume: Resumption | None = None,
    ) -> Ending:
        """The stage's command, then what it left (values, artifacts, handoff): the attempt's
        ending. With `resume` (the reconcile found the effect under way) its effect_resume runs
        instead, as the command would: its values, artifacts and handoff recorded alike."""
        if run.reason is not None:  # stopped while reconciling or waiting
            raise Ended(Ending.abandoned())
        if plan.effect is not None:
            return self.effect(run, plan, op_id, workspace, env, envelope, shipper, resume)
        command = plan.command if resume is None else resume.command
        assert command is not None  # a plan without an effect has a command (StagePlan)
        # Lines marked ::warning:: are counted on their way to the log (relevo_agent.warning_lines).
        warnings = WarningLines(shipper.write)
        # A shard of a stage with tests.plan: its tests, before the command (relevo_agent.shard_tests).
        planned = for_shard(self, run, plan, workspace, envelope, env, shipper, warnings.write)
        if planned is not None:
            env = {**env, **planned.environment()}
        with (
            self._signing_keychain(run, plan, op_id, envelope) as keychain,
            self._output_watch(run, plan, op_id, shipper, {**env, **keychain}) as watch,
        ):
            env = {**env, **keychain, "RELEVO_OUTPUT": str(watch.path)}
            if resume is not None:
                env = {**env, **self._resuming(run, op_id, shipper, watch, resume)}
            result = self.under_lease(run, plan, command, workspace, env, warnings.write)
            # Read whatever the command ended with, before its handoff is stored and its end said.
            tests = read_stage_reports(self.config.agent_id, run, plan, workspace, envelope, shipper)
            excused = tests is not None and tests.failed_only_in_quarantine and not result.signaled
            left = self._what_it_left(
                run, plan, result, watch, env, envelope, shipper, prepared, workspace, excused
            )
            # A command that failed only on quarantined tests built what its caches hold.
            save_stage_caches(
                run,
                prepared,
                succeeded=(warning_lines.ended_well(plan, result.exit_code) or excused)
                and left.error is None,
            )
        if run.reason is not None:
            return Ending.stopped_by(run.reason, result.exit_code)
        ran = Ran(op_id, self.config.agent_id, run.ref.attempt, Path(env["RELEVO_ARTIFACT_DIR"]))
        ending = ending_of(ran, plan, result, left, warnings, shipper, tests)
        if planned is not None and ending.error is None:
            ending = checked(
                planned, None if tests is None else tests.tests, ending, shipper, self.config.agent_id
            )
        if resume is not None and ending.error is not None and ending.stage_outcome is None:
            # The effect is still out there (a submission Apple is checking): a retry probes it
            # again (outcome unknown) rather than run the command, which would start a second one.
            ending = replace(ending, stage_outcome=stage_attempts.AttemptOutcome.UNKNOWN)
        return ending

    def effect_context(
        self,
        run: StageRun,
        plan: StagePlan,
        op_id: str,
        workspace: Path,
        env: dict[str, str],
        envelope: JobEnvelope,
        shipper: Any,
        values: dict[str, str] | None,
    ) -> tuple[EffectContext, Any]:
        """What the stage's built-in effect is given (relevo_agent.effects.agent_side), and its mask.
        `values`: the stage's values so far, which its `record` adds to (journal first, then the
        stage record, fenced); None for a probe, which records nothing. Raises FileProblem."""
        from relevo_agent.effects.agent_side import ReleaseKeys, effect_context, effect_file
        from relevo_agent.effects.kind import Endpoints

        assert plan.effect is not None
        keys = ReleaseKeys(envelope.project)
        mask = keys.masker(Masker(secret_values(self.config.mask, env)))

        def line(text: str) -> None:
            text = mask(text)
            log.info("%s %s", op_id, text)
            shipper.line(text)

        def record(new: dict[str, str]) -> None:
            if values is None:
                raise RuntimeError("a probe only reads: it records nothing")
            masked = {str(key): mask(str(value)) for key, value in new.items()}
            changed = [key for key, value in masked.items() if values.get(key) != value]
            values.update(masked)
            if changed:
                self._outputs_changed(run, op_id, shipper, dict(values), changed)

        endpoints = self.config.release_endpoints
        build_number = env.get("RELEVO_BUILD_NUMBER")
        context = effect_context(
            operation_id=op_id,
            workspace=workspace,
            file=effect_file(workspace, plan.effect.file),
            build_number=int(build_number) if build_number else None,
            endpoints=Endpoints(endpoints.app_store_connect, endpoints.notary, endpoints.github),
            record=record,
            line=line,
            keys=keys,
            time_left=run.exec_left,
            stop=run.cancel,
        )
        return context, mask

    def effect(
        self,
        run: StageRun,
        plan: StagePlan,
        op_id: str,
        workspace: Path,
        env: dict[str, str],
        envelope: JobEnvelope,
        shipper: Any,
        resume: Resumption | None = None,
    ) -> Ending:
        """The stage's built-in effect instead of a command, under the attempt's lease: performed
        (or, with `resume`, the one under way waited for), its values recorded as a command's
        $RELEVO_OUTPUT values are, its ending made as a command's: succeeded with its values, or
        failed with the kind's error class (a transient one leaves the outcome unknown: the retry
        probes before it acts again)."""
        from relevo_agent.effects.agent_side import FileProblem, values_to_string
        from relevo_agent.effects.kind import EffectFailed
        from relevo_agent.effects.registry import UnknownKind, kind_for

        assert plan.effect is not None
        ref = run.ref
        started = time.monotonic()
        values: dict[str, str] = {}
        cause: dict[str, Any] = {
            "effect": plan.effect.kind,
            "agent_id": self.config.agent_id,
            "attempt": ref.attempt,
        }
        try:
            kind = kind_for(plan, self.config.release_endpoints)
            context, mask = self.effect_context(run, plan, op_id, workspace, env, envelope, shipper, values)
        except (UnknownKind, FileProblem) as problem:
            error = problem.error_class if isinstance(problem, FileProblem) else ErrorClass.EFFECT_REFUSED
            why = problem.message if isinstance(problem, FileProblem) else str(problem)
            shipper.line(f"[relevo] {error.value}: {why}")
            return Ending.failed(error, {**cause, "why": why})
        if resume is not None:
            shipper.line(
                f"[relevo] the effect ({plan.effect.kind}) is in progress: resumed, not started again"
            )
            # The previous attempt's values, carried on as this attempt's own before anything waits.
            context.record(dict(resume.previous_outputs))
        try:
            if resume is not None:
                left = kind.resume(context, dict(resume.previous_outputs))
            else:
                left = kind.perform(context)
            context.record(values_to_string(left))
        except EffectFailed as failed:
            why = mask(failed.message)
            shipper.line(f"[relevo] {failed.error_class.value}: {why}")
            if run.reason is not None:
                return Ending.stopped_by(run.reason, -1)
            receipt = self._effect_receipt(run, started, values)
            # A transient failure may have left the effect behind: the retry probes it first.
            unknown = stage_attempts.AttemptOutcome.UNKNOWN if failed.error_class.retryable else None
            return Ending.failed(failed.error_class, {**cause, "why": why}, receipt, stage_outcome=unknown)
        except Exception as exc:  # noqa: BLE001 - a kind's own fault: what it did is unknown
            log.exception("%s attempt %d: the effect %s failed", op_id, ref.attempt, plan.effect.kind)
            why = mask(f"the effect failed unexpectedly ({type(exc).__name__})")
            shipper.line(f"[relevo] {why}: retried, reconciled first")
            if run.reason is not None:
                return Ending.stopped_by(run.reason, -1)
            receipt = self._effect_receipt(run, started, values)
            return Ending.failed(
                ErrorClass.TRANSIENT_EXIT,
                {**cause, "why": why},
                receipt,
                stage_outcome=stage_attempts.AttemptOutcome.UNKNOWN,
            )
        if run.reason is None and run.lease.fenced():
            # The effect ended at or after the fence: the next holder may already be probing.
            run.stop("fenced")
        if run.reason is not None:
            return Ending.stopped_by(run.reason, -1)
        log.info("%s effect %s done in %.1fs", op_id, plan.effect.kind, time.monotonic() - started)
        return Ending.succeeded(self._effect_receipt(run, started, values, done=True), 0)

    def _effect_receipt(
        self, run: StageRun, started: float, values: dict[str, str], done: bool = False
    ) -> dict[str, Any]:
        """As a command's receipt (relevo_agent.receipt), without an exit code but a success's 0."""
        return {
            **({"exit_code": 0} if done else {}),
            "duration_sec": round(time.monotonic() - started, 3),
            "artifacts": {},
            "agent_id": self.config.agent_id,
            "attempt": run.ref.attempt,
            "outputs": dict(values),
        }

    def _resuming(
        self, run: StageRun, op_id: str, shipper: Any, watch: OutputWatch, resume: Resumption
    ) -> dict[str, str]:
        """The previous attempt's values, carried on as this attempt's own (journaled and recorded
        before the resume starts: a later attempt finds the submission id on this one), and given
        to the resume as RELEVO_PREVIOUS_OUT_<KEY>, as the probe had them."""
        from relevo_core.models.handoff import previous_output_variable

        shipper.line("[relevo] the effect is in progress: its effect_resume runs, not its command")
        if resume.previous_outputs:
            watch.parser.values = dict(resume.previous_outputs)
            self._outputs_changed(
                run, op_id, shipper, dict(resume.previous_outputs), list(resume.previous_outputs)
            )
        return {
            "RELEVO_RESUME": "1",
            **{previous_output_variable(key): value for key, value in resume.previous_outputs.items()},
        }

    @contextmanager
    def _signing_keychain(
        self, run: StageRun, plan: StagePlan, op_id: str, envelope: JobEnvelope
    ) -> Iterator[dict[str, str]]:
        """A temporary signing keychain for the command when the plan signs ($RELEVO_KEYCHAIN; no
        variable when it does not), deleted however the command ends (exit, exec timeout, cancel,
        shutdown); a failed delete is logged and swept at the next start, never the stage's failure."""
        if envelope.signing is None:
            yield {}
            return
        ref = run.ref
        try:
            self.keychains.require()  # on an agent that cannot, before any secret is read
            identities = read_identities(envelope.signing)
            keychain = self.keychains.create(
                f"{ref.job_id}.{plan.name}.{ref.attempt}", identities, plan.exec_timeout_sec
            )
        except KeychainFailure as failure:
            log.warning("%s attempt %d: no signing keychain: %s", op_id, ref.attempt, failure.message)
            cause = {"keychain": failure.message, "agent_id": self.config.agent_id, "attempt": ref.attempt}
            raise Ended(Ending.failed(failure.error_class, cause)) from failure
        try:
            yield {"RELEVO_KEYCHAIN": str(keychain)}
        finally:
            self.keychains.delete(keychain)

    @contextmanager
    def _output_watch(
        self, run: StageRun, plan: StagePlan, op_id: str, shipper: Any, env: dict[str, str]
    ) -> Iterator[OutputWatch]:
        """The stage's values ($RELEVO_OUTPUT, relevo_agent.outputs): journaled, then recorded
        (fenced) as each line completes, beside the command; its file removed afterwards."""
        from relevo_agent.outputs import OutputWatch

        ref = run.ref
        watch = OutputWatch.create(
            self.config.workspace_root / ".relevo-outputs" / f"{ref.job_id}.{plan.name}.{ref.attempt}",
            secret_values(self.config.mask, env),
            lambda values, changed: self._outputs_changed(run, op_id, shipper, values, changed),
            owner=self.config.build_user,
        )
        watch.start()
        try:
            yield watch
        finally:
            watch.path.unlink(missing_ok=True)

    def _what_it_left(
        self,
        run: StageRun,
        plan: StagePlan,
        result: ExecResult,
        watch: OutputWatch,
        env: dict[str, str],
        envelope: JobEnvelope,
        shipper: Any,
        prepared: Prepared,
        workspace: Path,
        excused: bool = False,
    ) -> WhatItLeft:
        """The command's values; then, after a success, its artifacts (relevo_agent.artifacts) and
        its handoff, stored while the lease is still kept, each record fenced on the attempt.
        `excused`: the command failed only because of quarantined tests (it ends `warning`)."""
        from relevo_agent.artifacts import upload_stage_artifacts
        from relevo_agent.handoff import HandoffFailure
        from relevo_agent.outputs import OutputInvalid

        try:
            left = WhatItLeft(outputs=watch.stop())
        except OutputInvalid as invalid:
            left = WhatItLeft(dict(watch.parser.values), error=ErrorClass.OUTPUT_INVALID, why=str(invalid))
        ended_well = warning_lines.ended_well(plan, result.exit_code) or excused
        if not ended_well or run.reason is not None or left.error:
            return left
        artifact_dir = Path(env["RELEVO_ARTIFACT_DIR"])
        left.error = upload_stage_artifacts(
            run.ref, plan.name, artifact_dir, envelope, self.config, shipper, run.cancel, run.transfer
        )
        if run.reason is None and left.error is None and plan.handoff:
            try:
                left.handoff = store_stage_handoff(
                    self.config, run, plan, workspace, envelope, shipper, prepared
                )
            except HandoffFailure as failure:
                left.error, left.why = failure.error_class, failure.message
        return left

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
