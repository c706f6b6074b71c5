"""How a stage attempt ends on this agent: journal first (outcome, receipt and the outbox entry in
one transaction, relevo_agent.journal), then report (relevo_agent.outbox: the outcome route makes
the fenced stage write and answers the run token). An attempt stopped before its end is concluded by why it was
stopped; one that never ran anything is only journaled (abandoned).
"""

from __future__ import annotations

import logging
from typing import Any

from relevo_agent.attempt import StageReport, StageRun
from relevo_agent.claim import RUN_TOKEN_WAIT_SEC
from relevo_agent.journal import Journal, OperationOutcome, stage_of
from relevo_agent.outbox import Outbox
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts

log = logging.getLogger(__name__)


class Concluder:
    def __init__(self, journal: Journal, outbox: Outbox) -> None:
        self.journal = journal
        self.outbox = outbox

    def conclude(
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
        # A fast command can end before the run is known to be handed. The result is journaled
        # either way; the outcome route makes the fenced stage write even when no run token was
        # handed (relevo_agent.outbox).
        run.token_known.wait(RUN_TOKEN_WAIT_SEC + 5)
        report = StageReport(
            job_id=ref.job_id,
            stage=stage_of(op_id),
            stage_index=ref.stage_index,
            shard=ref.shard,
            attempt=ref.attempt,
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

    def stopped(self, run: StageRun, op_id: str, exit_code: int) -> None:
        """The command was stopped before its end: by a shutdown (reported, retryable, outcome
        unknown so the retry reconciles), fenced (the lease deadline came: killed, result
        withheld), or taken over or canceled (nothing claimed: another attempt may own the stage)."""
        if run.reason == "shutdown":
            self.conclude(
                run,
                op_id,
                StageStatus.FAILED,
                OperationOutcome.ABANDONED,
                None,
                exit_code=exit_code,
                error=ErrorClass.AGENT_SHUTDOWN,
                cause="the agent was shut down while the stage ran",
                stage_outcome=stage_attempts.AttemptOutcome.UNKNOWN,
            )
            return
        if run.reason == "fenced":
            log.warning(
                "%s attempt %d fenced: killed at the lease deadline less the margin; result withheld",
                op_id,
                run.ref.attempt,
            )
            self.journal.record(op_id, run.ref.attempt, OperationOutcome.FENCED, None, None)
            return
        log.warning("%s attempt %d stopped (%s); result withheld", op_id, run.ref.attempt, run.reason)
        self.abandon(run, op_id)

    def abandon(self, run: StageRun, op_id: str) -> None:
        self.journal.record(op_id, run.ref.attempt, OperationOutcome.ABANDONED, None, None)


def _stage_outcome(status: StageStatus) -> stage_attempts.AttemptOutcome:
    return (
        stage_attempts.AttemptOutcome.SUCCEEDED if status.succeeded else stage_attempts.AttemptOutcome.FAILED
    )
