"""What a person reads of a stage that was reconciled rather than run again, of a stage with shards
that failed, and of a stage a rejection held back: in `relevo job view` (its row and notes), in
`relevo job logs` (a stage's end line), in a group notification and in the commit status
(issue 42, findings 2 and 7)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from relevo_cli.follow import StageLog, end_words
from relevo_cli.job_view import job_notes, render_job
from relevo_core.jobs.logs import stage_marks
from relevo_core.jobs.view import job_items_to_view
from relevo_core.models.group import GroupEvent
from relevo_core.models.job_view import JobView
from relevo_core.models.status import JobStatus
from relevo_core.notify.commit_status import describe
from relevo_core.notify.groups import job_notices
from relevo_core.notify.messages import email_message, slack_message
from relevo_core.notify.transitions import job_transition
from relevo_core.store.keys import JOB_SK, shard_sk, stage_sk
from tests.unit.test_envelope import minimal_envelope

AT = "2026-12-03T10:00:{:02d}+00:00"
PROBED = {
    "previous_attempt": 1,
    "previous_agent": "mac-t2",
    "probe_exit": 0,
    "probe_output": "uploaded op-1",
    "precondition_before": "commit=a",
    "precondition_now": "commit=a",
}
RECONCILED_UPLOAD = {
    "stage_name": "upload",
    "status": "succeeded",
    "attempt": 2,
    "agent_id": "mac-t1",
    "exit_code": 0,
    "error_class": "",
    "started_at": AT.format(10),
    "ended_at": AT.format(12),
    "outcome": "reconciled",
    "attempts_log": [{"attempt": 1, "agent": "mac-t2", "error": "Relevo.Lease.Expired"}],
    "reconciled": {
        "attempt": 2,
        "agent_id": "mac-t1",
        "decision": "succeeded",
        "evidence": PROBED,
        "at": AT.format(11),
    },
    "reconciliations": [
        {"attempt": 2, "agent_id": "mac-t1", "decision": "succeeded", "evidence": PROBED, "at": AT.format(11)}
    ],
}
SAID = "upload#2 reconciled on mac-t1: the effect of attempt 1 exists (probe exit 0); not run again"


def _items(
    job_status: str, stages: list[dict[str, Any]], records: dict[str, dict[str, Any]], **job: Any
) -> list[dict[str, Any]]:
    return [
        {
            "pk": "JOB#x",
            "sk": JOB_SK,
            "status": job_status,
            "envelope": minimal_envelope(stages=stages),
            **job,
        },
        *({"pk": "STAGES#x", "sk": sk, **record} for sk, record in records.items()),
    ]


def _printed(table: Any) -> str:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text()


UPLOAD = [
    {"name": "build", "command": "make"},
    {"name": "upload", "command": "upload", "effect_probe": "probe"},
]
BUILT = {"stage_name": "build", "status": "succeeded", "attempt": 1, "agent_id": "mac-t1", "exit_code": 0}


def test_job_view_shows_a_reconciled_stage_with_the_probes_verdict_and_the_attempt_that_did_it():
    # Given an upload whose Mac was killed, and whose attempt 2 found attempt 1's effect and did not run
    view = job_items_to_view(
        _items("succeeded", UPLOAD, {stage_sk(0): BUILT, stage_sk(1): RECONCILED_UPLOAD})
    )
    view = JobView.model_validate({**view, "queue_detail": None}).model_dump(mode="json")

    # When `relevo job view` prints it
    table = _printed(render_job(view))
    notes = job_notes(view)

    # Then the row says reconciled, not a second success, and a note says what the probe found
    [row] = [line for line in table.splitlines() if " upload " in line]
    assert "reconciled" in row and "succeeded" not in row, row
    assert SAID in notes, notes


def test_logs_end_a_reconciled_stage_with_the_reconciliation_not_a_success():
    view = job_items_to_view(
        _items("succeeded", UPLOAD, {stage_sk(0): BUILT, stage_sk(1): RECONCILED_UPLOAD})
    )
    marks = stage_marks(view["stages"][1])

    assert end_words(("upload", 2, None), marks) == SAID
    # the attempt that died is still said as it ended
    assert (
        end_words(("upload", 1, None), marks)
        == "upload#1 failed on mac-t2: Relevo.Lease.Expired, retried as attempt 2"
    )


def test_logs_say_a_manual_review_and_a_changed_precondition_as_reconciliations():
    review = {
        **RECONCILED_UPLOAD,
        "status": "manual_review",
        "error_class": "Relevo.Reconcile.ManualReview",
        "reconciled": {
            "attempt": 2,
            "agent_id": "mac-t1",
            "decision": "manual_review",
            "evidence": {**PROBED, "why": "the effect exists but does not name this operation"},
        },
    }
    changed = {
        **RECONCILED_UPLOAD,
        "status": "failed",
        "error_class": "Relevo.Precondition.Changed",
        "reconciled": {
            "attempt": 2,
            "agent_id": "mac-t1",
            "decision": "precondition_changed",
            "evidence": {
                **PROBED,
                "probe_exit": 1,
                "why": "the precondition changed since the previous attempt",
            },
        },
    }
    review_view = job_items_to_view(_items("running", UPLOAD, {stage_sk(0): BUILT, stage_sk(1): review}))
    changed_view = job_items_to_view(_items("failed", UPLOAD, {stage_sk(0): BUILT, stage_sk(1): changed}))

    assert end_words(("upload", 2, None), stage_marks(review_view["stages"][1])) == (
        "upload#2 reconciled on mac-t1: the effect exists but does not name this operation (probe exit 0); "
        "not run again: waiting for a person (relevo job resolve)"
    )
    assert end_words(("upload", 2, None), stage_marks(changed_view["stages"][1])) == (
        "upload#2 reconciled on mac-t1: the effect of attempt 1 is absent (probe exit 1) and the "
        "precondition changed since; "
        "not run again (Relevo.Precondition.Changed)"
    )
    # A stage in manual review is said once everything before it is printed: `relevo job logs` is not silent
    # about it.
    printed: list[str] = []
    StageLog(printed.append).settle({"stages": [stage_marks(stage) for stage in review_view["stages"]]})
    assert any("upload#2 reconciled on mac-t1: the effect exists" in line for line in printed), printed


SHARDED = [{"name": "build", "command": "make"}, {"name": "test", "command": "make test", "parallel": 3}]
FAILED_FAST = {
    stage_sk(0): BUILT,
    # What the state machine writes (job.asl.json MarkShardedStageFailed): last_error, no error_class.
    stage_sk(1): {
        "stage_name": "test",
        "status": "failed",
        "shard_count": 3,
        "last_error": "Relevo.Fatal.ExitCode",
        "failed_shards": '{"exit_code": 1}',
    },
    shard_sk(1, 0): {
        "stage_name": "test",
        "shard_index": 0,
        "status": "canceled",
        "attempt": 1,
        "agent_id": "mac-1",
    },
    shard_sk(1, 1): {
        "stage_name": "test",
        "shard_index": 1,
        "status": "failed",
        "attempt": 1,
        "agent_id": "mac-2",
        "exit_code": 1,
        "error_class": "Relevo.Fatal.ExitCode",
    },
    shard_sk(1, 2): {
        "stage_name": "test",
        "shard_index": 2,
        "status": "canceled",
        "attempt": 1,
        "agent_id": "mac-3",
    },
}


def test_a_failed_stage_with_shards_carries_its_failed_shards_and_class_and_its_end_line_says_why():
    # Given a fail-fast stage whose shard 1 exited 1
    view = job_items_to_view(_items("failed", SHARDED, FAILED_FAST))
    answered = JobView.model_validate({**view, "queue_detail": None}).model_dump(mode="json")
    test = answered["stages"][1]

    # Then its own row (`relevo job view --json`) has the class and the failed shard
    assert (test["error_class"], test["failed_shards"]) == ("Relevo.Fatal.ExitCode", [1])
    # and `relevo job logs` ends it with what the view knows, not "no cause recorded"
    assert end_words(("test", 0, None), stage_marks(view["stages"][1])) == (
        "test failed: test[1] failed on mac-2: its command exited 1 (Relevo.Fatal.ExitCode)"
    )


GATED = [{"name": "build", "command": "make"}, {"name": "deploy", "command": "ship"}]


def test_a_stage_a_rejection_held_back_is_said_rejected_by_whom_and_why():
    decision = {
        "decision": "rejected",
        "actor": "arn:aws:iam::1:user/rm",
        "reason": "crash on launch in QA",
        "stage": "deploy",
        "at": AT.format(20),
    }
    view = job_items_to_view(_items("failed", GATED, {stage_sk(0): BUILT}, approval_decision=decision))

    marks = stage_marks(view["stages"][1], view["approval_decision"])

    assert end_words(("deploy", 0, None), marks) == (
        "deploy skipped: rejected by arn:aws:iam::1:user/rm at its approval gate: crash on launch in QA"
    )


def _job_record(status: str, **extra: Any) -> dict[str, Any]:
    envelope = minimal_envelope(stages=UPLOAD)
    envelope.pop("commit", None)
    return {
        "pk": "JOB#x",
        "sk": JOB_SK,
        "job_id": "job_x",
        "project": "app",
        "status": status,
        "envelope": envelope,
        "updated_at": AT.format(30),
        **extra,
    }


def test_the_notification_and_the_commit_status_say_the_reconciliation_and_the_resolved_commit():
    # Given a run without a commit, whose first checkout resolved one, and whose upload was reconciled
    transition = job_transition(
        _job_record("running"), _job_record("succeeded", last_successful_stage="upload")
    )
    assert transition is not None and transition.commit is None
    commit = "4f" * 20
    records = [
        {**BUILT, "sk": stage_sk(0), "checkout_commit": commit},
        {**RECONCILED_UPLOAD, "sk": stage_sk(1)},
    ]

    # When the reporter adds what the stage records say
    from relevo_core.notify.transitions import with_stage_records

    told = with_stage_records(transition, records, [])

    # Then the commit status names the reconciliation, and the group's message the commit and it
    assert told.commit == commit and told.status is JobStatus.SUCCEEDED
    assert describe(told) == f"succeeded; {SAID}"
    [(notice, _)] = job_notices(told, "https://console/jobs/job_x")
    assert notice.event is GroupEvent.JOB_SUCCEEDED and ("Commit", commit[:12]) in notice.facts()
    assert SAID in str(slack_message(notice)) and SAID in email_message(notice)[1]
