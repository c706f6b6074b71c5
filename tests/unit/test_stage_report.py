"""An agent's report of one attempt is a typed StageReport (relevo_agent.attempt). It is what the
journal's outbox keeps, so a report journaled before an upgrade (the same keys, as a JSON object)
must read back unchanged, and a report written now must keep that shape."""

from __future__ import annotations

import json

from relevo_agent.attempt import StageReport
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store.stage_attempts import AttemptOutcome

# An outbox entry as the journal held it before StageReport (every key the agent wrote).
JOURNALED = {
    "job_id": "job_1",
    "stage": "build",
    "stage_index": 0,
    "attempt": 2,
    "status": "succeeded",
    "outcome": "succeeded",
    "exit_code": 0,
    "error": None,
    "cause": None,
    "receipt": {"exit_code": 0, "duration_sec": 1.5, "artifacts": {}, "agent_id": "mac-a", "attempt": 2},
    "lease_ended": True,
}


def test_a_journaled_report_reads_back_as_it_was_written():
    report = StageReport.model_validate(JOURNALED)
    assert (report.status, report.outcome, report.error) == (
        StageStatus.SUCCEEDED,
        AttemptOutcome.SUCCEEDED,
        None,
    )
    assert report.payload() == JOURNALED
    assert json.loads(json.dumps(report.payload())) == JOURNALED  # what the outbox stores is JSON


def test_a_report_keeps_the_claim_secret_its_job_credentials_are_resumed_with():
    report = StageReport.model_validate({**JOURNALED, "claim_secret": "a" * 64})
    assert StageReport.model_validate(json.loads(json.dumps(report.payload()))).claim_secret == "a" * 64


def test_a_report_journaled_without_the_later_keys_reads_with_their_defaults():
    older = {key: value for key, value in JOURNALED.items() if key != "lease_ended"}
    report = StageReport.model_validate(older)
    assert report.lease_ended is False


def test_a_report_an_earlier_agent_journaled_with_its_run_token_reads_back_without_it():
    """Earlier agents kept the run token in the report; the outcome route has it now, and the
    token is not sent on nor kept in what the outbox stores again."""
    report = StageReport.model_validate({**JOURNALED, "run_token": "token-2"})
    assert "run_token" not in report.payload() and report.payload() == JOURNALED


def test_a_failure_report_keeps_its_error_name():
    report = StageReport(
        job_id="job_1",
        stage="build",
        stage_index=0,
        attempt=1,
        status=StageStatus.FAILED,
        outcome=AttemptOutcome.UNKNOWN,
        error=ErrorClass.AGENT_SHUTDOWN.value,
        cause="agent_restart_interrupted",
    )
    assert (
        report.payload()["error"] == "Relevo.Transient.AgentShutdown" and report.payload()["receipt"] is None
    )


def test_a_shards_report_keeps_its_shard():
    report = StageReport.model_validate({**JOURNALED, "shard": 3})
    assert StageReport.model_validate(json.loads(json.dumps(report.payload()))).shard == 3


def test_a_failure_reports_cause_is_cut_to_the_longest_the_state_machine_carries():
    """relevo_core.plan_limits counts every failure's cause at MAX_FAILURE_CAUSE_CHARS at most: the
    dead-letter path, a stage's shards. An agent's longer cause (a long `why`, a quote-heavy probe
    output JSON-escaped) is cut to it, its head kept and the cut said; SendTaskFailure would
    refuse one over 32,768 characters outright (botocore's model: SensitiveCause, max 32768), and
    the report would stay in the outbox."""
    from relevo_core.plan_limits import MAX_FAILURE_CAUSE_CHARS

    # Given: a cause at the bound, and one far over it
    at_bound = '"' * MAX_FAILURE_CAUSE_CHARS
    over = json.dumps({"why": '"quoted" \\ ' * 10_000})

    # When: each is reported
    def reported(cause: str) -> str:
        report = StageReport(
            job_id="job_1",
            stage="build",
            stage_index=0,
            attempt=1,
            status=StageStatus.FAILED,
            outcome=AttemptOutcome.FAILED,
            error=ErrorClass.COMMAND_FAILED.value,
            cause=cause,
        )
        return StageReport.model_validate(json.loads(json.dumps(report.payload()))).cause

    # Then: the one at the bound is unchanged, the other cut to the bound, saying from how long
    assert reported(at_bound) == at_bound
    cut = reported(over)
    assert len(cut) == MAX_FAILURE_CAUSE_CHARS
    assert cut.startswith(over[:3000]) and cut.endswith(f" [cut from {len(over):,} characters]")
