"""Reconcile-before-retry decisions, without AWS: receipt, probe and precondition."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from relevo_agent.executor import TAIL_BYTES, run_command
from relevo_agent.journal import Operation, OperationOutcome
from relevo_agent.logs import MASK, Masker, secret_values
from relevo_agent.reconcile import (
    EVIDENCE_CHARS,
    ProbeResult,
    ReconcileAction,
    decide,
    precondition_version,
    wants_probe,
)
from relevo_core.store.stage_attempts import needs_reconcile

OP = "job_1:upload"
PRE = "commit=abc;inputs=00"
# The stage record as a previous attempt left it when its agent vanished mid-stage.
LOST = {"attempt": 1, "agent_id": "mac-a", "precondition_version": PRE}


def _probe(exit_code: int, output: str, secrets: tuple[str, ...] = (), cut: bool = False) -> ProbeResult:
    return ProbeResult.masked(exit_code, output, Masker(secrets), cut)


def _local(outcome: OperationOutcome, receipt=None) -> Operation:
    return Operation(OP, "job_1", "upload", 0, 1, "/ws", PRE, outcome, receipt)


@pytest.mark.parametrize(
    ("previous", "attempt", "expected"),
    [
        ({}, 1, False),  # first attempt: nothing before it
        (LOST, 2, True),  # lease lost without a receipt
        ({**LOST, "outcome": "unknown"}, 2, True),  # killed (shutdown, restart)
        ({**LOST, "outcome": "succeeded", "receipt": {"exit_code": 0}}, 2, True),  # ack lost
        ({**LOST, "outcome": "failed"}, 2, False),  # an ordinary failure is simply retried
        ({**LOST, "outcome": "manual_review"}, 2, False),  # an operator chose retry
        (LOST, 1, False),  # the same attempt again
    ],
)
def test_which_previous_attempts_need_reconciling(previous, attempt, expected):
    assert needs_reconcile(previous, attempt) is expected


def test_a_local_success_receipt_is_resent_without_probing():
    local = _local(OperationOutcome.SUCCEEDED, {"exit_code": 0, "artifacts": {"a.ipa": "ff"}})

    assert not wants_probe(local, LOST)
    result = decide(OP, local, LOST, PRE, None)

    assert result.action is ReconcileAction.RESEND
    assert result.receipt == {"exit_code": 0, "artifacts": {"a.ipa": "ff"}}
    assert "journal" in result.evidence["source"]


def test_a_success_recorded_on_the_stage_but_never_acknowledged_is_resent():
    previous = {**LOST, "outcome": "succeeded", "receipt": {"exit_code": 0}}

    result = decide(OP, None, previous, PRE, None)

    assert (result.action, result.receipt) == (ReconcileAction.RESEND, {"exit_code": 0})
    assert "stage record" in result.evidence["source"]


def test_a_local_failure_receipt_is_not_resent_as_a_success():
    assert wants_probe(_local(OperationOutcome.FAILED, {"exit_code": 2}), LOST)


def test_an_effect_naming_the_operation_is_reconciled_as_succeeded():
    result = decide(OP, None, LOST, PRE, _probe(0, f"uploaded build 42 for {OP}\n"))

    assert result.action is ReconcileAction.SUCCEEDED
    assert result.receipt["reconciled"] is True
    assert result.evidence["probe_exit"] == 0 and OP in result.evidence["probe_output"]


def test_an_effect_that_does_not_name_the_operation_goes_to_manual_review():
    result = decide(OP, None, LOST, PRE, _probe(0, "uploaded build 42 for job_0:upload\n"))

    assert result.action is ReconcileAction.MANUAL_REVIEW
    assert result.receipt is None


def test_a_probe_that_cannot_tell_goes_to_manual_review():
    assert decide(OP, None, LOST, PRE, _probe(2, "403")).action is ReconcileAction.MANUAL_REVIEW


def test_an_absent_effect_under_the_same_precondition_is_rerun():
    result = decide(OP, None, LOST, PRE, _probe(1, ""))

    assert result.action is ReconcileAction.RERUN
    assert (result.evidence["precondition_before"], result.evidence["precondition_now"]) == (PRE, PRE)


def test_an_absent_effect_after_the_ref_moved_stops_with_precondition_changed():
    result = decide(OP, None, LOST, "commit=def;inputs=00", _probe(1, ""))

    assert result.action is ReconcileAction.PRECONDITION_CHANGED


def test_without_a_probe_the_precondition_decides():
    assert decide(OP, None, LOST, PRE, None).action is ReconcileAction.RERUN
    assert decide(OP, None, LOST, "commit=zzz;inputs=00", None).action is ReconcileAction.PRECONDITION_CHANGED


def test_the_precondition_follows_the_ref_in_a_git_workspace_and_the_declared_inputs(tmp_path: Path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "one")
    (tmp_path / "Podfile.lock").write_text("a")
    first = precondition_version(tmp_path, "refs/heads/main", "0" * 40, ("*.lock",))

    assert first.startswith("commit=") and "0" * 40 not in first  # the ref, not the job's commit
    assert precondition_version(tmp_path, "refs/heads/main", "0" * 40, ("*.lock",)) == first
    (tmp_path / "Podfile.lock").write_text("b")
    changed_input = precondition_version(tmp_path, "refs/heads/main", "0" * 40, ("*.lock",))
    assert changed_input != first
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "two")
    assert precondition_version(tmp_path, "refs/heads/main", "0" * 40, ("*.lock",)) != changed_input


def test_outside_a_git_checkout_the_precondition_is_the_jobs_commit(tmp_path: Path):
    assert precondition_version(tmp_path, "refs/heads/main", "abc1234", ()).startswith("commit=abc1234;")


CANARY = "canary-7f3a9c2e51d04b86"


def test_a_secret_in_the_probe_output_never_reaches_the_evidence_or_the_receipt():
    # The effect names the operation and, carelessly, the deploy token too.
    result = decide(OP, None, LOST, PRE, _probe(0, f"uploaded {OP} with token={CANARY}\n", (CANARY,)))

    assert result.action is ReconcileAction.SUCCEEDED  # tied to the operation on the output as printed
    assert (
        result.evidence["probe_output"]
        == result.receipt["probe_output"]
        == f"uploaded {OP} with token={MASK}\n"
    )
    assert CANARY not in repr(result)


@pytest.mark.parametrize("exit_code", [0, 2])  # present but not tied / the probe cannot tell
def test_a_secret_in_the_output_of_a_probe_sent_to_manual_review_is_masked(exit_code):
    result = decide(OP, None, LOST, PRE, _probe(exit_code, f"found build 41 signed with {CANARY}", (CANARY,)))

    assert result.action is ReconcileAction.MANUAL_REVIEW
    assert result.evidence["probe_output"] == f"found build 41 signed with {MASK}"
    assert CANARY not in repr(result)


def test_the_kept_tail_is_masked_before_it_is_cut_and_a_cut_secret_leaves_no_piece():
    # A secret that straddles the evidence's cut is masked whole first.
    straddling = "x" * (EVIDENCE_CHARS - 5) + CANARY + "y" * 3
    shown = _probe(0, straddling, (CANARY,)).shown
    assert CANARY[-8:] not in shown and shown.endswith(MASK[-3:] + "yyy") and len(shown) == EVIDENCE_CHARS
    # Output that is itself only the end of what the probe printed (the executor keeps a tail)
    # may start inside a secret: that piece is masked too.
    begins_mid_secret = CANARY[5:] + " then the effect of " + OP
    shown = _probe(0, begins_mid_secret, (CANARY,), cut=True).shown
    assert (
        CANARY[5:] not in shown and CANARY[-4:] not in shown and shown.startswith(MASK) and shown.endswith(OP)
    )


def test_a_real_probe_printing_a_masked_variable_is_recorded_masked(tmp_path: Path):
    """The agent's path: the probe runs with the stage's environment, its output tail is masked
    with the values of the agent's `mask` variables (as logs are) before it is decided on."""
    env = {"PATH": "/usr/bin:/bin", "DEPLOY_TOKEN": CANARY, "RELEVO_OPERATION_ID": OP}
    probe = (
        'head -c 5000 /dev/zero | tr "\\0" "p"; echo; echo "effect of $RELEVO_OPERATION_ID '
        'token=$DEPLOY_TOKEN"'
    )
    ran = run_command(
        probe,
        tmp_path,
        env,
        timeout_sec=30,
        cancel=threading.Event(),
        on_output=lambda chunk: None,
        grace_sec=1,
    )

    cut = len(ran.output_tail.encode()) >= TAIL_BYTES
    result = decide(
        OP,
        None,
        LOST,
        PRE,
        ProbeResult.masked(ran.exit_code, ran.output_tail, Masker(secret_values(["DEPLOY_TOKEN"], env)), cut),
    )

    assert cut and CANARY in ran.output_tail  # the secret was there to leak
    assert result.action is ReconcileAction.SUCCEEDED
    assert result.evidence["probe_output"].endswith(f"effect of {OP} token={MASK}\n")
    assert CANARY not in repr(result)
