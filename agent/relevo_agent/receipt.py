"""What a stage's command ended with, as its attempt's ending (relevo_agent.ending): the receipt
(exit code, duration, the artifacts' checksums, its values, its handoff, its warnings) and, for a
failure, its error class (relevo_agent.classify: exit codes, output rules, retry) and cause.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relevo_agent import warning_lines
from relevo_agent.classify import classify
from relevo_agent.ending import Ending
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store.stage_attempts import AttemptOutcome

if TYPE_CHECKING:
    from relevo_agent.executor import ExecResult
    from relevo_agent.logs import LogShipper
    from relevo_agent.test_reports import TestsRead
    from relevo_agent.warning_lines import WarningLines
    from relevo_core.models.plan import StagePlan

log = logging.getLogger(__name__)


@dataclass
class WhatItLeft:
    """What the command left beside its exit: its values ($RELEVO_OUTPUT), its handoff's summary,
    and, when they could not be kept, the error class the stage fails with and why."""

    outputs: dict[str, str] = field(default_factory=dict)
    handoff: dict[str, Any] | None = None
    error: ErrorClass | None = None
    why: str | None = None


@dataclass(frozen=True)
class Ran:
    """One run of a stage's command on this agent: the attempt's operation, whose agent, and where
    the command left its artifacts."""

    op_id: str
    agent_id: str
    attempt: int
    artifact_dir: Path


def ending_of(
    ran: Ran,
    plan: StagePlan,
    result: ExecResult,
    left: WhatItLeft,
    warnings: WarningLines,
    shipper: LogShipper,
    tests: TestsRead | None = None,
) -> Ending:
    """The ending of a command that ran to its end (not stopped): succeeded (with warnings when
    its ::warning:: lines say so), killed by a signal this agent did not send, or failed as
    classified. With `tests` (the stage declares reports): its summary rides on the ending; a
    report it could not read makes a success `warning`, and a command that failed only because of
    quarantined tests ends `warning`, saying so."""
    ending = _ending_of(ran, plan, result, left, warnings, shipper, tests)
    return ending if tests is None else replace(ending, tests=tests.summary)


def _ending_of(
    ran: Ran,
    plan: StagePlan,
    result: ExecResult,
    left: WhatItLeft,
    warnings: WarningLines,
    shipper: LogShipper,
    tests: TestsRead | None,
) -> Ending:
    receipt: dict[str, Any] = {
        "exit_code": result.exit_code,
        "duration_sec": round(result.duration_sec, 3),
        "artifacts": _checksums(ran.artifact_dir),
        "agent_id": ran.agent_id,
        "attempt": ran.attempt,
        "outputs": left.outputs,
    }
    if left.handoff is not None:
        receipt["handoff"] = left.handoff
    excused = tests is not None and tests.failed_only_in_quarantine and not result.signaled
    if (warning_lines.ended_well(plan, result.exit_code) or excused) and left.error is None:
        warned = warning_lines.warning_summary(
            plan, result.exit_code, warnings, _tests_said(tests, result.exit_code, excused)
        )
        if warned is not None:
            receipt["warnings"] = warned
            shipper.line(f"[relevo] succeeded with warnings: {warned['text']}")
        log.info(
            "%s %s in %.1fs",
            ran.op_id,
            "succeeded with warnings" if warned else "succeeded",
            result.duration_sec,
        )
        status = StageStatus.WARNING if warned else StageStatus.SUCCEEDED
        return Ending.succeeded(receipt, result.exit_code, status)
    cause: dict[str, Any] = {"exit_code": result.exit_code, "agent_id": ran.agent_id, "attempt": ran.attempt}
    if left.why:
        cause["why"] = left.why
        shipper.line(f"[relevo] {left.error.value if left.error else ''}: {left.why}")
    if result.signaled and not result.timed_out:
        # Killed by a signal this agent did not send (an operator, the OOM killer): what it had
        # done is unknown, so it is retried and the retry reconciles before it runs anything.
        cause["killed_by_signal"] = result.signaled
        log.warning(
            "%s was killed by signal %d, not by this agent: retried, reconciled first",
            ran.op_id,
            result.signaled,
        )
        return Ending.failed(
            ErrorClass.TRANSIENT_EXIT,
            cause,
            receipt,
            result.exit_code,
            stage_outcome=AttemptOutcome.UNKNOWN,
        )
    error = left.error or classify(result.exit_code, result.output_tail, plan.retry, result.timed_out)
    log.info("%s failed: %s (exit %d)", ran.op_id, error.value, result.exit_code)
    return Ending.failed(error, cause, receipt, result.exit_code)


def _tests_said(tests: TestsRead | None, exit_code: int, excused: bool) -> str | None:
    """What the stage's tests add to why it is `warning` (None: nothing)."""
    if tests is None:
        return None
    if excused:
        names = ", ".join(tests.failing_quarantined[:3])
        more = len(tests.failing_quarantined) - 3
        return (
            f"exit {exit_code}: failed only because of quarantined tests ({names}"
            + (f" and {more} more" if more > 0 else "")
            + ")"
        )
    if tests.warnings:
        count = len(tests.warnings)
        return f"test reports: {tests.warnings[0]}" + (f" (and {count - 1} more)" if count > 1 else "")
    return None


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
