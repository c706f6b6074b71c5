"""The agent's local journal: WAL mode, operations keyed by operation id, results recorded with
their outbox entry in one transaction, and reports that survive a restart until sent."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from relevo_agent.journal import Journal, Operation, OperationOutcome, operation_id


def _op(attempt: int = 1, **changes) -> Operation:
    values = dict(
        operation_id=operation_id("job_1", "build"),
        job_id="job_1",
        stage="build",
        stage_index=0,
        attempt=attempt,
        resource_key="/ws/app",
        precondition_version="commit=abc;inputs=00",
    )
    values.update(changes)
    return Operation(**values)


def test_the_journal_is_in_wal_mode_and_keys_operations_by_job_and_stage(tmp_path: Path):
    journal = Journal(tmp_path / "j.sqlite3")
    journal.begin(_op())

    mode = sqlite3.connect(tmp_path / "j.sqlite3").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    found = journal.get("job_1:build")
    assert found is not None
    assert (found.attempt, found.outcome, found.resource_key, found.precondition_version) == (
        1,
        OperationOutcome.RUNNING,
        "/ws/app",
        "commit=abc;inputs=00",
    )


def test_a_result_and_its_outbox_entry_are_written_together_and_survive_a_restart(tmp_path: Path):
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    journal.begin(_op())
    journal.record("job_1:build", 1, OperationOutcome.SUCCEEDED, {"exit_code": 0}, {"status": "succeeded"})
    journal.close()

    reopened = Journal(path)
    op = reopened.get("job_1:build")
    assert (op.outcome, op.receipt) == (OperationOutcome.SUCCEEDED, {"exit_code": 0})
    [report] = reopened.pending()
    assert (report.operation_id, report.attempt, report.payload) == (
        "job_1:build",
        1,
        {"status": "succeeded"},
    )

    reopened.failed_to_send(report.id)
    assert reopened.pending()[0].tries == 1
    reopened.sent(report.id)
    assert reopened.pending() == []


def test_in_flight_lists_only_operations_whose_command_was_running(tmp_path: Path):
    journal = Journal(tmp_path / "j.sqlite3")
    journal.begin(_op())
    journal.begin(_op(operation_id="job_2:sign", job_id="job_2", stage="sign"))
    journal.record("job_2:sign", 1, OperationOutcome.FAILED, {"exit_code": 2}, None)

    assert [op.operation_id for op in journal.in_flight()] == ["job_1:build"]
    assert journal.pending() == []  # no report asked for: nothing in the outbox


def test_a_new_attempt_of_the_same_operation_replaces_the_entry_and_clears_its_receipt(tmp_path: Path):
    journal = Journal(tmp_path / "j.sqlite3")
    journal.begin(_op())
    journal.record("job_1:build", 1, OperationOutcome.SUCCEEDED, {"exit_code": 0}, None)
    journal.begin(_op(attempt=2))

    op = journal.get("job_1:build")
    assert (op.attempt, op.outcome, op.receipt) == (2, OperationOutcome.RUNNING, None)


def test_a_record_for_an_attempt_the_journal_no_longer_holds_changes_nothing(tmp_path: Path):
    journal = Journal(tmp_path / "j.sqlite3")
    journal.begin(_op(attempt=2))
    journal.record("job_1:build", 1, OperationOutcome.SUCCEEDED, {"exit_code": 0}, None)

    assert journal.get("job_1:build").outcome is OperationOutcome.RUNNING


def test_the_journal_its_wal_and_shm_and_a_written_stack_file_are_the_agents_alone(tmp_path: Path):
    """A build user (`run_as`) must not read them: 0600 whatever the umask, an older journal tightened."""
    import os
    import stat

    from relevo_core.files.stack import StackInfo, write_stack_file

    older = tmp_path / "journal.sqlite3"
    sqlite3.connect(older).close()
    older.chmod(0o644)
    journal = Journal(older)
    journal.begin(_op())  # the -wal and -shm files exist while the journal is open
    stack_file = write_stack_file(
        StackInfo(api_url="http://x", region="us-east-1", resources={}, work_queues={}),
        tmp_path / "stack.json",
    )
    modes = {
        path.name: stat.S_IMODE(os.stat(path).st_mode)
        for path in (older, Path(f"{older}-wal"), Path(f"{older}-shm"), stack_file)
    }
    journal.close()
    assert modes == {
        "journal.sqlite3": 0o600,
        "journal.sqlite3-wal": 0o600,
        "journal.sqlite3-shm": 0o600,
        "stack.json": 0o600,
    }


def test_a_run_token_an_earlier_agent_journaled_is_cleared_when_the_journal_opens(tmp_path: Path):
    """A run token is a capability the stack keeps to itself: earlier agents kept it in the
    journal, and none may stay on the Mac's disk once this agent opens it."""
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    journal.begin(_op())
    journal.close()
    with sqlite3.connect(path) as db:  # what an earlier agent left
        db.execute("UPDATE operations SET run_token='AQCkAAAAKgAAAAMAAAAA-run-token'")
    Journal(path).close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT run_token FROM operations").fetchall() == [(None,)]
