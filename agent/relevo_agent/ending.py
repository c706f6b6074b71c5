"""How one stage attempt ended on this agent, as a value: what every step of the attempt returns or
raises (`Ended`), and what the one conclusion (relevo_agent.conclude, Concluder.end) journals and
reports, once, after everything else. Agent-internal: what leaves the Mac is the StageReport made
from it (relevo_agent.attempt).

    journaled only (status None)  abandoned: nothing ran, or the run was taken over or canceled
                                  fenced: killed at the lease deadline, its result withheld
                                  unanswered: the claim's answer was lost (the next delivery finds out)
    journaled and reported        succeeded, warning, failed, manual_review (the status)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from relevo_agent.journal import OperationOutcome
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store.stage_attempts import AttemptOutcome


@dataclass(frozen=True)
class Ending:
    """`outcome`: what the journal keeps. `status`: what is reported (None: journaled only).
    `stopped`: why the run was stopped before its end (StageRun.reason), when it was. `let_go`: no
    command ran under the claim and the dispatch no longer waits for it: the claim is let go once
    its lease is no longer renewed. `hand_back`: trouble before the claim took; the message goes
    straight back to the queue (HandBack) with this as why."""

    outcome: OperationOutcome
    status: StageStatus | None = None
    receipt: dict[str, Any] | None = None
    exit_code: int | None = None
    error: ErrorClass | None = None
    cause: str | None = None
    stage_outcome: AttemptOutcome | None = None
    stopped: str | None = None
    let_go: bool = False
    hand_back: str | None = None
    # What the attempt's test reports said (a ResultsSummary's JSON, relevo_agent.test_reports).
    tests: dict[str, Any] | None = None

    @property
    def reported(self) -> bool:
        return self.status is not None

    @classmethod
    def abandoned(cls, stopped: str | None = None, let_go: bool = False) -> Ending:
        """Nothing of the attempt is reported: it never ran, or another attempt may own the stage."""
        return cls(OperationOutcome.ABANDONED, stopped=stopped, let_go=let_go)

    @classmethod
    def stopped_by(cls, reason: str | None, exit_code: int) -> Ending:
        """A run stopped before its end, by why: a shutdown is reported (retryable, its outcome
        unknown, so the retry reconciles); a fence withholds the result (killed at the lease
        deadline less the margin); a takeover or a cancel abandons it (nothing is claimed)."""
        if reason == "shutdown":
            return cls(
                OperationOutcome.ABANDONED,
                StageStatus.FAILED,
                exit_code=exit_code,
                error=ErrorClass.AGENT_SHUTDOWN,
                cause="the agent was shut down while the stage ran",
                stage_outcome=AttemptOutcome.UNKNOWN,
                stopped=reason,
            )
        if reason == "fenced":
            return cls(OperationOutcome.FENCED, stopped=reason)
        return cls.abandoned(stopped=reason or "stopped")

    @classmethod
    def failed(
        cls,
        error: ErrorClass,
        cause: dict[str, Any] | str,
        receipt: dict[str, Any] | None = None,
        exit_code: int | None = None,
        outcome: OperationOutcome = OperationOutcome.FAILED,
        status: StageStatus = StageStatus.FAILED,
        stage_outcome: AttemptOutcome | None = None,
    ) -> Ending:
        """A failure reported with its error class and cause (a dict is sent as JSON)."""
        return cls(
            outcome,
            status,
            receipt=receipt,
            exit_code=exit_code,
            error=error,
            cause=cause if isinstance(cause, str) else json.dumps(cause),
            stage_outcome=stage_outcome,
        )

    @classmethod
    def succeeded(
        cls,
        receipt: dict[str, Any] | None,
        exit_code: int,
        status: StageStatus = StageStatus.SUCCEEDED,
        outcome: OperationOutcome = OperationOutcome.SUCCEEDED,
    ) -> Ending:
        return cls(outcome, status, receipt=receipt, exit_code=exit_code)

    @classmethod
    def handed_back(cls, why: str, unanswered: bool) -> Ending:
        """A claim that did not go through: `unanswered` when it may have landed (no answer, or
        the gateway's 5xx), which the next delivery to this agent finds out."""
        outcome = OperationOutcome.UNANSWERED if unanswered else OperationOutcome.ABANDONED
        return cls(outcome, hand_back=why)

    def report_outcome(self) -> AttemptOutcome:
        """The attempt's outcome as the stage record keeps it (reported endings only)."""
        if self.stage_outcome is not None:
            return self.stage_outcome
        succeeded = self.status is not None and self.status.succeeded
        return AttemptOutcome.SUCCEEDED if succeeded else AttemptOutcome.FAILED


class Ended(Exception):
    """Raised by a step of an attempt that ends it there (a failed checkout, a stop, a decided
    reconcile, a claim that did not take): the one conclusion takes its ending."""

    def __init__(self, ending: Ending) -> None:
        super().__init__(ending.outcome.value, ending.stopped or ending.error or ending.status)
        self.ending = ending
