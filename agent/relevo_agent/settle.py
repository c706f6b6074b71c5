"""Settling what the previous attempt of a stage left unknown, before this attempt runs anything
(relevo_agent.reconcile decides): a receipt re-sent, the stage's effect probe run under this
attempt's lease, the decision journaled, then recorded on the stage (fenced). The attempt ends
there (Ended) unless the decision is to run the stage again, or to resume the effect under way
(its effect_resume runs instead of its command: a Resumption).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from relevo_agent import reconcile
from relevo_agent.attempt import utc_now
from relevo_agent.claimed import ClaimedAttempt
from relevo_agent.config import AgentConfig
from relevo_agent.ending import Ended, Ending
from relevo_agent.execute import StageCommand
from relevo_agent.executor import TAIL_BYTES
from relevo_agent.journal import OperationOutcome
from relevo_agent.logs import Masker, secret_values
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.reconcile import ProbeResult, Reconciliation

log = logging.getLogger(__name__)

Action = reconcile.ReconcileAction


class Settle:
    """`command`: runs the effect probe under the attempt's lease (relevo_agent.execute)."""

    def __init__(self, config: AgentConfig, command: StageCommand) -> None:
        self.config = config
        self.command = command

    def previous(
        self, attempt: ClaimedAttempt, precondition: str, env: dict[str, str]
    ) -> reconcile.Resumption | None:
        """Decide the previous attempt's unknown outcome: returns None when the stage is to run
        again (re-run), a Resumption when its effect is under way and its effect_resume is to
        run; raises Ended with the decision otherwise (or when the run was stopped)."""
        ref, plan = attempt.run.ref, attempt.plan
        probe, found = self._effect_probe(attempt, env) if plan.effect else (self._probe(attempt, env), {})
        reconciled = reconcile.decide(
            attempt.op_id,
            attempt.local,
            attempt.previous,
            precondition,
            probe,
            resumable=bool(plan.effect_resume) or plan.effect is not None,
        )
        if reconciled.action is Action.SUCCEEDED:
            # A built-in effect's probe found the values it leaves (ids, the host's state).
            outputs = {**reconcile.previous_outputs(attempt.local, attempt.previous), **found}
            reconciled = reconcile.with_what_it_left(
                reconciled, attempt.plan.handoff, attempt.previous, outputs
            )
        log.info(
            "%s attempt %d reconciled: %s %s",
            attempt.op_id,
            ref.attempt,
            reconciled.action.value,
            reconciled.evidence,
        )
        # Journaled first, as everything the attempt decides: the local record of what it runs.
        self.command.journal.set_reconciled(attempt.op_id, ref.attempt, reconciled.action.value)
        try:
            stage_attempts.record_reconciled(ref, reconciled.action.value, reconciled.evidence, utc_now())
        except stage_attempts.LeaseLost as lost:
            raise Ended(Ending.abandoned()) from lost
        if reconciled.action is Action.RERUN:
            return None
        if reconciled.action is Action.RESUME and (plan.effect_resume or plan.effect):
            outputs = reconcile.previous_outputs(attempt.local, attempt.previous)
            return reconcile.Resumption(plan.effect_resume, outputs)
        raise Ended(_ending(reconciled))

    def _probe(self, attempt: ClaimedAttempt, env: dict[str, str]) -> ProbeResult | None:
        """The stage's effect probe, run when the plan has one and no receipt decides; it asks
        about what the previous attempt recorded (a submission id, say). None: no probe."""
        from relevo_core.models.handoff import previous_output_variable

        run, plan = attempt.run, attempt.plan
        if not plan.effect_probe or not reconcile.wants_probe(attempt.local, attempt.previous):
            return None
        previous_outputs = reconcile.previous_outputs(attempt.local, attempt.previous)
        probe_env = {
            **env,
            "RELEVO_PROBE": "1",
            **{previous_output_variable(k): v for k, v in previous_outputs.items()},
        }
        result = self.command.under_lease(
            run, plan, plan.effect_probe, attempt.workspace, probe_env, lambda chunk: None, probe=True
        )
        if run.reason is not None:
            raise Ended(Ending.stopped_by(run.reason, result.exit_code))
        # Masked like the stage's logs before any of it is recorded or logged.
        return reconcile.ProbeResult.masked(
            -1 if result.timed_out else result.exit_code,
            result.output_tail,
            Masker(secret_values(self.config.mask, env)),
            cut=len(result.output_tail.encode()) >= TAIL_BYTES,
        )

    def _effect_probe(
        self, attempt: ClaimedAttempt, env: dict[str, str]
    ) -> tuple[ProbeResult | None, dict[str, str]]:
        """The stage's built-in effect probed (kind.probe) about what the previous attempt
        recorded, its answer read as a probe's exit (relevo_agent.effects.agent_side), and the
        values a DONE effect leaves. (None, {}) when a receipt decides."""
        from relevo_agent.effects.agent_side import FileProblem, probe_result, values_to_string
        from relevo_agent.effects.kind import Answer, ProbeAnswer
        from relevo_agent.effects.registry import UnknownKind, kind_for

        run, plan = attempt.run, attempt.plan
        if not reconcile.wants_probe(attempt.local, attempt.previous):
            return None, {}
        previous_outputs = reconcile.previous_outputs(attempt.local, attempt.previous)
        try:
            kind = kind_for(plan, self.config.release_endpoints)
            context, mask = self.command.effect_context(
                run, plan, attempt.op_id, attempt.workspace, env, attempt.envelope, run.shipper, None
            )
        except (UnknownKind, FileProblem) as problem:
            found = ProbeAnswer(Answer.CANNOT_TELL, f"the effect cannot be probed here: {problem}")
            return probe_result(found, attempt.op_id, lambda text: text), {}
        try:
            found = kind.probe(context, previous_outputs)
        except Exception as exc:  # noqa: BLE001 - a probe that fails cannot tell
            log.exception("%s attempt %d: the effect's probe failed", attempt.op_id, run.ref.attempt)
            found = ProbeAnswer(Answer.CANNOT_TELL, f"the effect's probe failed ({type(exc).__name__})")
        if run.reason is not None:
            raise Ended(Ending.stopped_by(run.reason, -1))
        values = values_to_string(dict(found.values)) if found.answer is Answer.DONE else {}
        return probe_result(found, attempt.op_id, mask), {k: mask(v) for k, v in values.items()}


def _ending(reconciled: Reconciliation) -> Ending:
    """The ending a decision other than a re-run makes: the receipt re-sent (a success), a person
    asked (manual review), or the stage failed for its changed precondition."""
    if reconciled.action in (Action.RESEND, Action.SUCCEEDED):
        return Ending.succeeded(reconciled.receipt, 0, outcome=OperationOutcome.RECONCILED)
    if reconciled.action is Action.MANUAL_REVIEW:
        return Ending.failed(
            ErrorClass.MANUAL_REVIEW,
            reconciled.evidence,
            outcome=OperationOutcome.RECONCILED,
            status=StageStatus.MANUAL_REVIEW,
            stage_outcome=stage_attempts.AttemptOutcome.MANUAL_REVIEW,
        )
    return Ending.failed(
        ErrorClass.PRECONDITION_CHANGED, reconciled.evidence, outcome=OperationOutcome.RECONCILED
    )
