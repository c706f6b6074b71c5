"""The job view of a stage whose retry is dispatched but not yet claimed shows the retry, not
the failed attempt's agent and timings (those stay in attempts_log)."""

from __future__ import annotations

from relevo_core.jobs.view import job_items_to_view
from relevo_core.store.keys import JOB_SK
from tests.unit.test_envelope import minimal_envelope

FAILED_ATTEMPT = {
    "agent_id": "mac-1",
    "attempt": 1,
    "started_at": "2026-11-29T10:00:00+00:00",
    "ended_at": "2026-11-29T10:00:05+00:00",
    "exit_code": 75,
    "error_class": "Relevo.Transient.ExitCode",
}


def _view(stage_record: dict) -> dict:
    envelope = minimal_envelope()
    items = [
        {"pk": "JOB#x", "sk": JOB_SK, "status": "running", "envelope": envelope},
        {"pk": "STAGES#x", "sk": "STAGE#000", "stage_name": "build", **stage_record},
    ]
    return job_items_to_view(items)["stages"][0]


def test_a_dispatched_retry_shows_its_own_attempt_and_no_agent_yet():
    stage = _view(
        {
            **FAILED_ATTEMPT,
            "status": "dispatched",
            "dispatched_attempt": 2,
            "dispatched_at": "2026-11-29T10:00:07+00:00",
            "attempts_log": [{"attempt": 1, "agent_id": "mac-1", "error_class": "Relevo.Transient.ExitCode"}],
        }
    )
    assert (stage["status"], stage["attempt"], stage["dispatched_attempt"]) == ("dispatched", 2, 2)
    assert (stage["agent_id"], stage["started_at"], stage["exit_code"], stage["error_class"]) == (
        None,
        None,
        None,
        None,
    )
    assert stage["dispatched_at"] == "2026-11-29T10:00:07+00:00"
    assert stage["attempts_log"][0]["agent_id"] == "mac-1"


def test_a_claimed_or_ended_attempt_is_shown_as_recorded():
    running = _view(
        {
            **FAILED_ATTEMPT,
            "status": "running",
            "attempt": 2,
            "dispatched_attempt": 2,
            "exit_code": None,
            "error_class": None,
        }
    )
    assert (running["attempt"], running["agent_id"]) == (2, "mac-1")
    failed = _view({**FAILED_ATTEMPT, "status": "failed", "dispatched_attempt": 1})
    assert (failed["attempt"], failed["agent_id"], failed["exit_code"]) == (1, "mac-1", 75)
    first = _view({"status": "dispatched", "dispatched_attempt": 1})
    assert (first["attempt"], first["agent_id"]) == (None, None)


def test_every_reconciliation_of_a_stage_is_in_the_view_with_its_evidence():
    first = {
        "attempt": 2,
        "agent_id": "mac-2",
        "decision": "retry",
        "evidence": {"receipt": "none"},
        "at": "2026-11-29T10:01:00+00:00",
    }
    second = {
        "attempt": 3,
        "agent_id": "mac-1",
        "decision": "succeeded",
        "evidence": {"receipt": "found"},
        "at": "2026-11-29T10:02:00+00:00",
    }
    stage = _view(
        {**FAILED_ATTEMPT, "status": "succeeded", "reconciled": second, "reconciliations": [first, second]}
    )
    assert stage["reconciliations"] == [first, second] and stage["reconciled"] == second
    assert _view({**FAILED_ATTEMPT, "status": "failed"})["reconciliations"] == []
