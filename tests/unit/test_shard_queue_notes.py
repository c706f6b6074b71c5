"""`relevo status` says why each shard of a stage waits (the job view's `waiting_shards`)."""

from __future__ import annotations


def test_relevo_status_names_each_waiting_shard_with_its_reason():
    from relevo_cli.job_view import job_notes

    stage = {
        "index": 0,
        "name": "test",
        "status": "running",
        "attempt": None,
        "agent_id": None,
        "exit_code": None,
        "error_class": None,
    }
    job = {
        "job_id": "j-1",
        "project": "app",
        "status": "running",
        "queue_reason": "agent_busy",
        "held_reason": None,
        "ref": "main",
        "region_affinity": "eu",
        "stages": [stage],
        "waiting_shards": [
            {"stage": "test", "shard": 2, "attempt": 1, "queue_reason": "agent_busy", "queue_detail": None},
            {"stage": "test", "shard": 3, "attempt": 2, "queue_reason": None, "queue_detail": None},
        ],
    }
    notes = job_notes(job)
    assert (
        "test shard 2 (attempt 1) waiting (agent_busy): every agent of region affinity eu has all its slots "
        "in use" in notes
    )
    assert "test shard 3 (attempt 2) about to be claimed" in notes
