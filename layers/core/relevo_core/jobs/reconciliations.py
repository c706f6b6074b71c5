"""A reconciliation in words: what `relevo job view`, `relevo job logs`, the notifications and the
commit status say of a stage attempt that decided the unknown outcome of an earlier one (the
stage record's `reconciled`: relevo-agent's reconcile.py writes it, stage_attempts.record_reconciled
stores it) rather than run its command.

An entry is {attempt, agent_id, decision, evidence, at}: `attempt` and `agent_id` are the
reconciling attempt's; the evidence names the attempt whose outcome was unknown
(`previous_attempt`), the probe's exit (0 done, 1 absent, 118 in progress, anything else: it
could not tell), and why a person must look (`why`)."""

from __future__ import annotations

from typing import Any

# The decisions (relevo_agent.reconcile.ReconcileAction): the earlier attempt's effect counts, so
# the stage was not run again.
EFFECT_DONE = frozenset({"succeeded", "resend_receipt"})
MANUAL_REVIEW = "manual_review"
PRECONDITION_CHANGED = "precondition_changed"
RERUN = "rerun"
# The earlier attempt's effect is under way: the stage's effect_resume ran instead of its command.
RESUME = "resume"
# Decisions after which the attempt runs a command of its own (its result is the attempt's).
RUNS_AFTER = frozenset({RERUN, RESUME})


def _probe(evidence: dict[str, Any]) -> str:
    exit_code = evidence.get("probe_exit")
    return f" (probe exit {exit_code})" if isinstance(exit_code, int) else ""


def _earlier(evidence: dict[str, Any]) -> str:
    earlier = evidence.get("previous_attempt")
    return f"attempt {earlier}" if earlier is not None else "the earlier attempt"


def reconciled_words(entry: dict[str, Any]) -> str | None:
    """What the reconciliation found and did, after the colon of reconciled_line: `the effect of
    attempt 1 exists (probe exit 0); not run again`. None for an entry that is not one."""
    decision = entry.get("decision")
    given = entry.get("evidence")
    evidence: dict[str, Any] = given if isinstance(given, dict) else {}
    probed = isinstance(evidence.get("probe_exit"), int)
    if decision == "succeeded":
        return f"the effect of {_earlier(evidence)} exists{_probe(evidence)}; not run again"
    if decision == "resend_receipt":
        source = evidence.get("source")
        return (
            f"an earlier attempt had succeeded (its receipt: {source}); not run again"
            if source
            else "an earlier attempt had succeeded (its receipt was found); not run again"
        )
    if decision == MANUAL_REVIEW:
        why = str(evidence.get("why") or "the probe could not tell whether the effect exists")
        return f"{why}{_probe(evidence)}; not run again: waiting for a person (relevo job resolve)"
    if decision == PRECONDITION_CHANGED:
        found = (
            f"the effect of {_earlier(evidence)} is absent{_probe(evidence)}"
            if probed
            else "no effect probe is declared"
        )
        return f"{found} and the precondition changed since; not run again (Relevo.Precondition.Changed)"
    if decision == RERUN:
        found = (
            f"the effect of {_earlier(evidence)} is absent{_probe(evidence)}"
            if probed
            else f"no effect probe is declared and the precondition is as {_earlier(evidence)} had it"
        )
        return f"{found}; run again under the same operation id"
    if decision == RESUME:
        return (
            f"the effect of {_earlier(evidence)} is in progress{_probe(evidence)}; resumed under the same "
            "operation id (its effect_resume, not its command)"
        )
    return None


def reconciled_line(name: str, entry: dict[str, Any] | None) -> str | None:
    """`upload#2 reconciled on mac-t1: the effect of attempt 1 exists (probe exit 0); not run
    again` (`name`: the stage's, or a shard's `test[2]`). None without a reconciliation."""
    if not isinstance(entry, dict):
        return None
    words = reconciled_words(entry)
    if words is None:
        return None
    where = f" on {entry['agent_id']}" if entry.get("agent_id") else ""
    return f"{name}#{entry.get('attempt')} reconciled{where}: {words}"


def decided_by_reconcile(run: dict[str, Any]) -> dict[str, Any] | None:
    """The reconciliation that decided a stage's (or a shard's) shown attempt without running its
    command: its latest, when it is of that attempt and not a decision to run again."""
    entry = run.get("reconciled")
    if (
        not isinstance(entry, dict)
        or entry.get("decision") in RUNS_AFTER
        or entry.get("attempt") != run.get("attempt")
    ):
        return None
    return entry


def reconciled_status(run: dict[str, Any]) -> str:
    """The status a view shows of a stage or shard: `reconciled` for one that succeeded because
    the reconciliation found the earlier attempt's effect, else its own."""
    entry = decided_by_reconcile(run)
    if entry is not None and entry.get("decision") in EFFECT_DONE and run.get("status") == "succeeded":
        return "reconciled"
    return str(run.get("status"))
