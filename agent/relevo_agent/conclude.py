"""How a stage attempt ends on this agent, in one place (Concluder.end), once, after every step of
it: its ending (relevo_agent.ending) journaled first (outcome, receipt and the outbox entry in one
transaction, relevo_agent.journal), then reported (relevo_agent.outbox: the outcome route makes the
fenced stage write and answers the run token). An ending that reports nothing (abandoned, fenced,
a claim's answer lost) is only journaled.
"""

from __future__ import annotations

import logging
from typing import Any

from relevo_agent.attempt import StageReport, StageRun
from relevo_agent.dispatch import RUN_TOKEN_WAIT_SEC
from relevo_agent.ending import Ending
from relevo_agent.journal import Journal, OperationOutcome, stage_of
from relevo_agent.outbox import Outbox
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts

log = logging.getLogger(__name__)


class Concluder:
    """The one conclusion of the attempts of this agent (a test counts its call sites)."""

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
        tests: dict[str, Any] | None = None,
    ) -> None:
        """The report of an attempt: journal first (outcome, receipt and the outbox entry in one
        transaction), then sent. Only `end` calls it in the agent (a test may call it directly)."""
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
            outcome=stage_outcome or Ending(outcome, status).report_outcome(),
            exit_code=exit_code,
            error=error.value if error else None,
            cause=cause,
            receipt=receipt,
            tests=tests,
            lease_ended=True,  # nothing of this attempt runs any more here
            claim_secret=run.claim_secret,
        )
        self.journal.record(op_id, ref.attempt, outcome, receipt, report.payload())
        # The report's sending lets the attempt's job credentials go (relevo_agent.outbox).
        run.reported = True
        self.outbox.flush()

    def end(self, op_id: str, attempt: int, run: StageRun | None, ending: Ending) -> None:
        """The one conclusion of an attempt, after every step of it (relevo_agent.stage): a
        reported ending is journaled with its report and sent (conclude); any other is journaled
        only. `run`: None when the attempt ended before its claim took (nothing ran)."""
        if run is not None:
            if run.ending is not None:
                raise RuntimeError(f"{op_id} attempt {attempt} was concluded already ({run.ending.outcome})")
            run.ending = ending
        if ending.stopped == "fenced":
            log.warning(
                "%s attempt %d fenced: killed at the lease deadline less the margin; result withheld",
                op_id,
                attempt,
            )
        elif ending.stopped is not None and not ending.reported:
            log.warning("%s attempt %d stopped (%s); result withheld", op_id, attempt, ending.stopped)
        if run is None or ending.status is None:
            if run is not None:
                run.close_log()
            self.journal.record(op_id, attempt, ending.outcome, None, None)
            return
        self.conclude(
            run,
            op_id,
            ending.status,
            ending.outcome,
            ending.receipt,
            exit_code=ending.exit_code,
            error=ending.error,
            cause=ending.cause,
            stage_outcome=ending.report_outcome(),
            tests=ending.tests,
        )
