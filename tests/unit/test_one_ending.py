"""An attempt ends in one place (issue 43): however it ends (a failed checkout, a stop, a reconcile
that decides, the command's result, a claim that did not take), the steps of the attempt return or
raise its ending (relevo_agent.ending), and one call concludes it: journal, outbox, report.

Given the agent's source, when its calls are read (an AST scan, so that a new step cannot conclude
an attempt on its own without this test seeing it), then the Concluder's methods are called from
exactly one place outside relevo_agent.conclude, and an attempt's outcome is journaled only by the
Concluder (and by the restart, which reports the attempts a dead agent left).
"""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent" / "relevo_agent"
CONCLUDE = AGENT / "conclude.py"
# The restart concludes what a previous run of the agent left in flight, before any attempt runs.
RESTART = AGENT / "restart.py"


def _concluder_methods() -> set[str]:
    tree = ast.parse(CONCLUDE.read_text())
    (concluder,) = (node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Concluder")
    return {
        node.name
        for node in concluder.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    }


def _calls(path: Path, methods: set[str], receiver: str) -> list[str]:
    """`<…receiver>.<method>(…)` calls in `path`, as file:line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in methods
            and ast.unparse(node.func.value).lower().endswith(receiver)
        ):
            found.append(f"{path.relative_to(AGENT.parent)}:{node.lineno}")
    return found


def test_an_attempt_is_concluded_from_one_place():
    # Given the Concluder's methods (conclude, stopped, abandon, ... whatever it offers)
    methods = _concluder_methods()
    assert methods

    # When every module of the agent but the Concluder's own is scanned for calls of them
    sites = [
        site
        for path in sorted(AGENT.rglob("*.py"))
        if path != CONCLUDE
        for site in _calls(path, methods, "concluder")
    ]

    # Then exactly one place concludes an attempt
    assert len(sites) == 1, f"the Concluder is called from {len(sites)} places: {sites}"


def test_an_attempts_outcome_is_journaled_only_by_the_concluder():
    # Given every module of the agent but the journal, the Concluder and the restart
    others = [path for path in sorted(AGENT.rglob("*.py")) if path not in (CONCLUDE, RESTART)]

    # When they are scanned for a journal's record(...) (an outcome: the end of an attempt)
    sites = [site for path in others for site in _calls(path, {"record"}, "journal")]

    # Then none journals an ending of its own: every ending goes through the one conclusion
    assert sites == []


def test_an_attempt_is_concluded_once_and_a_second_ending_is_refused(tmp_path: Path):
    import time

    import pytest

    from relevo_agent.attempt import StageRun
    from relevo_agent.conclude import Concluder
    from relevo_agent.ending import Ending
    from relevo_agent.journal import Journal, Operation, OperationOutcome, operation_id
    from relevo_agent.lease import Lease
    from relevo_core.fleet.lease_timeline import LeaseTimeline
    from relevo_core.store.stage_attempts import StageRef

    # Given an attempt whose run was stopped by a fence and concluded so (journaled only)
    journal = Journal(tmp_path / "j.sqlite3")
    op_id = operation_id("job_1", "build")
    journal.begin(Operation(op_id, "job_1", "build", 0, 1, str(tmp_path), ""))
    run = StageRun(
        StageRef("table", "job_1", 0, 1, "mac-a"), Lease(LeaseTimeline(60, 10, 5), time.monotonic())
    )
    concluder = Concluder(journal, outbox=None)  # type: ignore[arg-type]  # nothing is reported here
    concluder.end(op_id, 1, run, Ending.stopped_by("fenced", -1))

    # When a second ending of the same attempt comes to the conclusion
    with pytest.raises(RuntimeError, match="concluded already"):
        concluder.end(op_id, 1, run, Ending.abandoned())

    # Then the first ending stands, in the journal and on the run
    operation = journal.get(op_id)
    assert operation is not None and operation.outcome is OperationOutcome.FENCED
    assert run.ending == Ending(OperationOutcome.FENCED, stopped="fenced")
