"""A stage's caches as the job view shows them: the stage record's outcomes (as the agent recorded
them) on GET /jobs/{id}'s stage (relevo_core.jobs.stage_records.caches_of, the StageView model)
and as lines of `relevo job view` (relevo_cli.job_view.cache_notes)."""

from __future__ import annotations

from decimal import Decimal

from relevo_cli.job_view import cache_notes
from relevo_core.jobs.stage_records import caches_of
from relevo_core.models.job_view import StageView

PARTIAL = {
    "name": "spm",
    "key": "spm/16C5032a-arm64-a7d2",
    "restore": "partial",
    "restored_key": "spm/16C5032a-arm64-3f1c",
    "bytes": Decimal(327_574_323),
    "downloaded_bytes": Decimal(0),
    "restore_seconds": Decimal("2.1"),
    "digest": "9b0e",
    "save": "saved",
    "saved_bytes": Decimal(328_204_288),
    "uploaded_bytes": Decimal(1_258_291),
    "save_seconds": Decimal("1.4"),
}
MISS = {
    "name": "pods",
    "key": "pods/nofiles",
    "restore": "miss",
    "save": "not_saved",
    "reason": "this job's ref does not write the project's caches (cache_write_refs)",
}


def test_a_stage_records_caches_are_on_its_view_and_a_record_that_is_not_one_is_left_out():
    # Given a stage record with a partial hit, a miss not saved, and an outcome of no known shape
    record = {"status": "succeeded", "caches": [PARTIAL, MISS, {"name": "odd", "restore": "maybe"}]}

    # When the job view reads it
    caches = caches_of(record)

    # Then the two outcomes are there, numbers as JSON numbers, and the stage's model takes them
    assert [(c["name"], c["restore"], c["save"]) for c in caches] == [
        ("spm", "partial", "saved"),
        ("pods", "miss", "not_saved"),
    ]
    assert caches[0]["bytes"] == 327_574_323 and caches[0]["restore_seconds"] == 2.1
    stage = StageView.model_validate({"index": 0, "name": "build", "status": "succeeded", "caches": caches})
    assert stage.caches[0].restored_key == "spm/16C5032a-arm64-3f1c"


def test_relevo_job_view_says_each_stages_cache_outcome_in_a_line():
    # Given a job whose build stage had a partial hit and whose shard of test missed, not saved
    shown = caches_of({"caches": [PARTIAL]})
    job = {
        "stages": [
            {"name": "build", "caches": shown},
            {
                "name": "test",
                "caches": [],
                "shards": [{"shard": 1, "label": "1", "caches": caches_of({"caches": [MISS]})}],
            },
        ]
    }

    # When `relevo job view` writes its notes
    notes = cache_notes(job)

    # Then each outcome is one line: what was restored from which key, bytes, seconds, the save
    assert notes[0] == (
        "build cache spm: partial hit spm/16C5032a-arm64-3f1c (key spm/16C5032a-arm64-a7d2): "
        "312.4 MiB in 2.1s, 0 B downloaded; saved 313.0 MiB (1.2 MiB uploaded in 1.4s)"
    )
    assert notes[1].startswith("test[1] cache pods: miss pods/nofiles; not saved (this job's ref does not")
    assert len(notes) == 2
