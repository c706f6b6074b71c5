"""Reconcile before retry: decide what really happened to an attempt whose outcome is unknown,
before anything runs again.

The decision uses, in order:
1. a receipt: the local journal's, or one the previous attempt recorded on the stage without it
   ever being acknowledged. A success receipt is re-sent; that is not a re-run.
2. the stage's `effect_probe`, a read-only command run with the stage's environment:
   exit 0 = the effect is done, exit 1 = it is absent, exit PROBE_IN_PROGRESS (118) = it was
   started and is still under way (a submission Apple is still checking), anything else (a
   timeout, a signal) = the probe cannot tell. A done or in-progress effect is tied to this
   operation when the probe's output names the operation id (`RELEVO_OPERATION_ID`, which the
   stage writes into what it produces, e.g. a submission's name). What is kept of the
   output (evidence on the stage, the reconciled receipt, the agent's log) is its tail with the
   values of the agent's `mask` variables replaced, as in the stage's logs.
3. the precondition: the commit the ref resolves to in the workspace, plus the hash of the
   inputs the stage declares, compared with what the previous attempt ran under.

    effect present, tied to the operation     -> succeeded, with the reconciled receipt
    effect in progress, tied, effect_resume    -> resume: the stage's `effect_resume` runs (never
                                                  its `run`) under the same operation id
    effect in progress, no effect_resume       -> manual_review: running it again would start a
                                                  second one
    effect present or in progress, not tied    -> manual_review: nothing is overwritten
    probe unsure (any other exit, timeout)     -> manual_review: nothing is run
    effect absent, precondition changed        -> Relevo.Precondition.Changed, not retried
    effect absent, precondition unchanged      -> re-run under the same operation id
    no probe declared                          -> as "absent": the precondition decides
"""

from __future__ import annotations

import glob
import hashlib
import subprocess
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

from relevo_agent.journal import Operation, OperationOutcome
from relevo_agent.logs import Masker

PROBE_PRESENT = 0
PROBE_ABSENT = 1
# "Started and still under way": a code no shell, runtime or common tool gives by accident
# (docs/agent.md says why not 3: jq's compile error, curl's malformed URL), so a probe that
# fails on its way cannot be read as a submission to wait for.
PROBE_IN_PROGRESS = 118
# How much of the probe's output the evidence and the receipt keep (its end).
EVIDENCE_CHARS = 1024


class ReconcileAction(str, Enum):
    RESEND = "resend_receipt"
    SUCCEEDED = "succeeded"
    RERUN = "rerun"
    # The effect is under way: the stage's effect_resume runs (waits for it), never its command.
    RESUME = "resume"
    MANUAL_REVIEW = "manual_review"
    PRECONDITION_CHANGED = "precondition_changed"


@dataclass(frozen=True)
class ProbeResult:
    exit_code: int
    # The output as the probe printed it: only ties the effect to the operation, never stored.
    output: str
    # Its masked tail: all that evidence and receipts carry off the machine.
    shown: str

    @classmethod
    def masked(cls, exit_code: int, output: str, masker: Masker, cut: bool = False) -> ProbeResult:
        """A probe's result; `cut` when `output` is only the end of what the probe printed."""
        return cls(exit_code, output, masker.mask_tail(output, EVIDENCE_CHARS, cut))


@dataclass(frozen=True)
class Reconciliation:
    action: ReconcileAction
    evidence: dict[str, Any]
    # The receipt reported for this attempt when it is not re-run (RESEND, SUCCEEDED).
    receipt: dict[str, Any] | None = field(default=None)


@dataclass(frozen=True)
class Resumption:
    """What an attempt runs after a RESUME decision instead of the stage's command: its
    `effect_resume`, given the values the previous attempt recorded (as the probe had them,
    RELEVO_PREVIOUS_OUT_<KEY>), which it carries on as its own. A stage with a built-in effect has
    no command: its kind resumes (None)."""

    command: str | None
    previous_outputs: dict[str, str]


def decide(
    operation_id: str,
    local: Operation | None,
    previous: dict[str, Any],
    current_precondition: str,
    probe: ProbeResult | None,
    resumable: bool = False,
) -> Reconciliation:
    """The protocol's decision. `previous` is the stage record as the previous attempt left it;
    `probe` is None when the stage declares no effect probe (run it only when `wants_probe`);
    `resumable` when the stage declares an effect_resume."""
    receipt = success_receipt(local, previous)
    if receipt is not None:
        return Reconciliation(ReconcileAction.RESEND, {"source": receipt.pop("_source")}, receipt)
    evidence: dict[str, Any] = {
        "previous_attempt": previous.get("attempt"),
        "previous_agent": previous.get("agent_id"),
        "precondition_before": previous.get("precondition_version") or None,
        "precondition_now": current_precondition,
    }
    if probe is not None:
        evidence["probe_exit"] = probe.exit_code
        evidence["probe_output"] = probe.shown
        if probe.exit_code == PROBE_PRESENT:
            if operation_id in probe.output:
                return Reconciliation(
                    ReconcileAction.SUCCEEDED,
                    evidence,
                    {"reconciled": True, "exit_code": 0, "probe_output": probe.shown},
                )
            evidence["why"] = "the effect exists but does not name this operation"
            return Reconciliation(ReconcileAction.MANUAL_REVIEW, evidence)
        if probe.exit_code == PROBE_IN_PROGRESS:
            return _in_progress(operation_id, probe, evidence, resumable)
        if probe.exit_code != PROBE_ABSENT:
            evidence["why"] = f"the effect probe could not tell (exit neither 0, 1 nor {PROBE_IN_PROGRESS})"
            return Reconciliation(ReconcileAction.MANUAL_REVIEW, evidence)
    else:
        evidence["probe"] = "none declared"
    before = previous.get("precondition_version") or (local.precondition_version if local else None)
    if before and before != current_precondition:
        evidence["why"] = "the precondition changed since the previous attempt"
        return Reconciliation(ReconcileAction.PRECONDITION_CHANGED, evidence)
    return Reconciliation(ReconcileAction.RERUN, evidence)


def _in_progress(
    operation_id: str, probe: ProbeResult, evidence: dict[str, Any], resumable: bool
) -> Reconciliation:
    """An effect started and still under way. Like a done one, it was started under this
    operation whatever the precondition is now: it is waited for, never started again."""
    if operation_id not in probe.output:
        evidence["why"] = "an effect is in progress but does not name this operation"
        return Reconciliation(ReconcileAction.MANUAL_REVIEW, evidence)
    if not resumable:
        evidence["why"] = (
            "the effect is still in progress and the stage declares no effect_resume to wait for it; "
            "running the stage again would start a second one"
        )
        return Reconciliation(ReconcileAction.MANUAL_REVIEW, evidence)
    return Reconciliation(ReconcileAction.RESUME, evidence)


def with_what_it_left(
    reconciled: Reconciliation, handoff: tuple[str, ...], previous: dict[str, Any], outputs: dict[str, str]
) -> Reconciliation:
    """A success the probe found, with what the previous attempt left for the later stages: the
    values it recorded as it ran, and the handoff it stored. A stage that hands files on but whose
    previous attempt never stored them cannot be called done: the later stages would run without
    them. It waits for a person instead (manual_review)."""
    receipt = dict(reconciled.receipt or {})
    if outputs:
        receipt["outputs"] = outputs
    if handoff:
        stored = previous.get("handoff_stored")
        if not isinstance(stored, dict) or stored.get("attempt") != previous.get("attempt"):
            evidence = {
                **reconciled.evidence,
                "why": "the effect exists, but the files the stage hands on were never stored (its holder "
                "stopped first): "
                "`relevo job resolve --as retry` runs it again",
            }
            return Reconciliation(ReconcileAction.MANUAL_REVIEW, evidence)
        receipt["handoff"] = stored
    return Reconciliation(reconciled.action, reconciled.evidence, receipt)


def wants_probe(local: Operation | None, previous: dict[str, Any]) -> bool:
    """The probe runs only when no receipt already decides."""
    return success_receipt(local, previous) is None


def success_receipt(local: Operation | None, previous: dict[str, Any]) -> dict[str, Any] | None:
    """A success that was recorded but never acknowledged: locally, or on the stage record."""
    if local is not None and local.outcome is OperationOutcome.SUCCEEDED and local.receipt is not None:
        return {**local.receipt, "_source": f"journal (attempt {local.attempt})"}
    if previous.get("outcome") == "succeeded" and isinstance(previous.get("receipt"), dict):
        return {**previous["receipt"], "_source": f"stage record (attempt {previous.get('attempt')})"}
    return None


def precondition_version(
    workspace: Path, ref: str, commit: str | None, inputs: tuple[str, ...], pinned: bool = False
) -> str:
    """`commit=<c>;inputs=<sha256>`. The commit is what `ref` resolves to in the workspace when it
    is a git checkout (so a moved ref shows), else the job's commit; with `pinned` (the agent
    checked the job's commit out: a moved ref changes nothing it builds) the job's commit. The
    hash covers the files the stage declares as inputs (workspace-relative globs), names and
    contents, as they are once the earlier stages' handoffs are restored."""
    resolved = (commit or "") if pinned else (_resolve_ref(workspace, ref) or commit or "")
    digest = hashlib.sha256()
    for pattern in inputs:
        for name in sorted(glob.glob(pattern, root_dir=workspace, recursive=True)):
            path = workspace / name
            if path.is_file():
                digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return f"commit={resolved};inputs={digest.hexdigest()[:16]}"


def _resolve_ref(workspace: Path, ref: str) -> str | None:
    if not (workspace / ".git").exists():
        return None
    try:
        # With run_as the workspace is the build user's, whose repository git would refuse to read
        # here. Named safe for this one command: rev-parse reads refs and objects, and runs no
        # hook, filter or fsmonitor (switched off all the same) that the build could have set.
        found = subprocess.run(
            [
                "git",
                "-c",
                f"safe.directory={workspace}",
                "-c",
                "core.fsmonitor=false",
                "-C",
                str(workspace),
                "rev-parse",
                "--verify",
                "--quiet",
                f"{ref}^{{commit}}",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found.stdout.strip() or None if found.returncode == 0 else None


def previous_outputs(local: Operation | None, previous: dict[str, Any]) -> dict[str, str]:
    """What the previous attempt recorded of its values as it ran: on its stage record, or (when
    it ran here) in this journal, which has them first."""
    outputs = given if isinstance(given := previous.get("outputs"), dict) else {}
    if local is not None and local.attempt == previous.get("attempt") and local.outputs:
        outputs = {**outputs, **local.outputs}
    return {str(key): str(value) for key, value in (outputs or {}).items()}


def previous_fence_in(previous: dict[str, Any], max_clock_skew_sec: float, now: float) -> float:
    """Seconds until the previous holder has fenced for sure, by this clock (`now`: time.time()):
    its recorded lease end plus the allowed clock skew; 0 when that has passed or nothing is
    recorded. A successor probes (or runs) only after it."""
    lease_end = previous.get("lease_expires_iso")
    if not lease_end:
        return 0.0
    return max(0.0, datetime.fromisoformat(str(lease_end)).timestamp() + max_clock_skew_sec - now)
