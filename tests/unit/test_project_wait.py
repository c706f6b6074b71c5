"""Why a job queued behind its project waits, as the listings say it (relevo_core.jobs.project_wait):
the project's lock is read once per project, and only for jobs that wait for their project."""

from __future__ import annotations

from relevo_core.jobs.project_wait import with_project_waits

GATE = {"job_id": "job_a", "stage": "upload", "since": "2026-12-01T10:00:00Z"}


def _row(job_id: str, project: str, status: str = "queued", reason: str | None = "project_running") -> dict:
    return {"job_id": job_id, "project": project, "status": status, "queue_reason": reason}


def test_rows_behind_a_gate_name_it_and_the_lock_is_read_once_per_project():
    # Given queued jobs of a gated project and of a running one, and jobs that do not wait for their project
    reads: list[str] = []

    def read_gate(_table: str, project: str):
        reads.append(project)
        return GATE if project == "gated" else None

    rows = [
        _row("b1", "gated"),
        _row("b2", "gated"),
        _row("c1", "busy"),
        _row("d1", "other", reason=None),
        _row("e1", "other2", status="running", reason=None),
    ]

    # When the listing says why each waits
    listed = with_project_waits("table", rows, read_gate)

    # Then the gated project's jobs say whose gate, the running project's say project_running, the rest
    # nothing new
    assert [(r["queue_reason"], r["waiting_behind"]) for r in listed] == [
        ("project_waiting_for_approval", GATE),
        ("project_waiting_for_approval", GATE),
        ("project_running", None),
        (None, None),
        (None, None),
    ]
    assert (
        "job job_a of its project waits for approval before upload since 2026-12-01T10:00:00Z"
        in listed[0]["queue_detail"]
    )
    assert listed[2]["queue_detail"] is None
    assert reads == ["gated", "busy"]
