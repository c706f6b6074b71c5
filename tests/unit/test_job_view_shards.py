"""GET /jobs/{id} of a job with a stage with shards: each shard's own record (STAGE#nn#SHARD#kk) is
a row under its stage, in shard order, with its label (its index, or its matrix combination), its
Mac, attempt, times and result; a shard not dispatched yet is pending (skipped once the job
ended); the log page's stage marks carry the same of each shard."""

from __future__ import annotations

from typing import Any

from relevo_core.jobs.logs import stage_marks
from relevo_core.jobs.view import job_items_to_view
from relevo_core.models.job_view import JobView
from relevo_core.store.keys import JOB_SK, shard_of_sk, shard_sk, stage_sk
from tests.unit.test_envelope import minimal_envelope

STAGES = [
    {"name": "build", "command": "make"},
    {"name": "test", "command": "make test", "parallel": 3},
    {
        "name": "ui",
        "command": "make ui",
        "matrix": {"device": ["iPhone 16", "iPad Air"], "os": ["18.2"]},
        "fail_fast": False,
    },
]
AT = "2026-12-03T10:00:{:02d}+00:00"


def _items(job_status: str, records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    envelope = minimal_envelope(stages=STAGES)
    return [
        {"pk": "JOB#x", "sk": JOB_SK, "status": job_status, "envelope": envelope},
        *({"pk": "STAGES#x", "sk": sk, **record} for sk, record in records.items()),
    ]


RUNNING = {
    stage_sk(0): {
        "stage_name": "build",
        "status": "succeeded",
        "attempt": 1,
        "agent_id": "mac-1",
        "started_at": AT.format(0),
        "ended_at": AT.format(5),
    },
    stage_sk(1): {"stage_name": "test", "status": "running", "shard_count": 3, "dispatched_at": AT.format(6)},
    shard_sk(1, 0): {
        "stage_name": "test",
        "shard_index": 0,
        "status": "succeeded",
        "attempt": 1,
        "agent_id": "mac-1",
        "started_at": AT.format(7),
        "ended_at": AT.format(19),
        "exit_code": 0,
    },
    shard_sk(1, 1): {
        "stage_name": "test",
        "shard_index": 1,
        "status": "running",
        "attempt": 2,
        "dispatched_attempt": 2,
        "agent_id": "mac-3",
        "started_at": AT.format(12),
        "retry_count": 1,
        "attempts_log": [
            {"attempt": 1, "agent": "mac-2", "error": "Relevo.Transient.ExitCode", "at": AT.format(11)}
        ],
    },
}


def test_each_shard_is_a_row_of_its_own_under_its_stage_with_its_mac_attempt_times_and_result():
    view = job_items_to_view(_items("running", RUNNING))
    build, test, ui = view["stages"]

    assert build["shards"] == [] and build["agent_id"] == "mac-1"
    # The stage's own record says how the stage as a whole goes; it names no Mac.
    assert (test["status"], test["agent_id"]) == ("running", None)
    assert [(s["shard"], s["label"], s["status"], s["attempt"], s["agent_id"]) for s in test["shards"]] == [
        (0, "0", "succeeded", 1, "mac-1"),
        (1, "1", "running", 2, "mac-3"),
        (2, "2", "pending", None, None),
    ]
    first, retried, _ = test["shards"]
    assert (first["started_at"], first["ended_at"], first["exit_code"]) == (AT.format(7), AT.format(19), 0)
    assert retried["retry_count"] == 1 and retried["attempts_log"][0]["agent"] == "mac-2"
    # A matrix's shards are labelled by their combination, its values kept apart too.
    assert [(s["label"], s["matrix"], s["status"]) for s in ui["shards"]] == [
        ("device=iPhone 16, os=18.2", {"device": "iPhone 16", "os": "18.2"}, "pending"),
        ("device=iPad Air, os=18.2", {"device": "iPad Air", "os": "18.2"}, "pending"),
    ]
    # What the API answers, as its OpenAPI document describes it.
    answered = JobView.model_validate({**view, "queue_detail": None}).model_dump(mode="json")
    assert answered["stages"][1]["shards"][1]["agent_id"] == "mac-3"


def test_a_shard_of_a_retried_shard_waiting_for_its_claim_shows_the_retry_not_the_failed_attempt():
    records = {
        **RUNNING,
        shard_sk(1, 1): {
            **RUNNING[shard_sk(1, 1)],
            "status": "dispatched",
            "attempt": 1,
            "dispatched_attempt": 2,
            "agent_id": "mac-2",
            "exit_code": 75,
            "error_class": "Relevo.Transient.ExitCode",
        },
    }
    shard = job_items_to_view(_items("running", records))["stages"][1]["shards"][1]
    assert (shard["status"], shard["attempt"], shard["agent_id"], shard["exit_code"]) == (
        "dispatched",
        2,
        None,
        None,
    )


def test_once_the_job_ended_a_shard_never_dispatched_is_skipped_and_a_canceled_sibling_says_so():
    records = {
        stage_sk(0): RUNNING[stage_sk(0)],
        stage_sk(1): {"stage_name": "test", "status": "failed", "shard_count": 3},
        shard_sk(1, 0): {
            "stage_name": "test",
            "shard_index": 0,
            "status": "failed",
            "attempt": 1,
            "agent_id": "mac-1",
            "exit_code": 2,
            "error_class": "Relevo.Fatal.ExitCode",
        },
        shard_sk(1, 1): {
            "stage_name": "test",
            "shard_index": 1,
            "status": "canceled",
            "attempt": 1,
            "agent_id": "mac-2",
        },
    }
    _, test, ui = job_items_to_view(_items("failed", records))["stages"]
    assert [(s["status"], s["error_class"]) for s in test["shards"]] == [
        ("failed", "Relevo.Fatal.ExitCode"),
        ("canceled", None),
        ("skipped", None),
    ]
    assert [s["status"] for s in ui["shards"]] == ["skipped", "skipped"]


def test_the_log_pages_stage_marks_carry_each_shards_label_state_and_failed_attempts():
    marks = stage_marks(job_items_to_view(_items("running", RUNNING))["stages"][1])
    assert [(m["shard"], m["label"], m["status"], m["attempt"], m["agent_id"]) for m in marks["shards"]] == [
        (0, "0", "succeeded", 1, "mac-1"),
        (1, "1", "running", 2, "mac-3"),
        (2, "2", "pending", None, None),
    ]
    assert marks["shards"][1]["failed_attempts"] == [
        {"attempt": 1, "agent": "mac-2", "error": "Relevo.Transient.ExitCode", "at": AT.format(11)}
    ]
    # When each shard's attempt started and ended: a follower says a shard began once it runs,
    # and how long it ran when it ended
    assert [(m["started_at"], m["ended_at"]) for m in marks["shards"]] == [
        (AT.format(7), AT.format(19)),
        (AT.format(12), None),
        (None, None),
    ]


def test_a_shard_record_key_reads_back_as_its_stage_and_shard_and_no_other_key_does():
    assert shard_of_sk(shard_sk(3, 12)) == (3, 12)
    assert [shard_of_sk(sk) for sk in (stage_sk(3), JOB_SK, "LOG#0000001")] == [None, None, None]
