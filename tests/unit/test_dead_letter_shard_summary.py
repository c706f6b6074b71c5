"""A dead-letter entry of a stage with shards that failed without fail_fast: its cause is the
stage's summary (job.asl.json: SummarizeShardFailures), bounded whatever the shards' causes, and
the entry's view names every failed shard. Each one's class and cause come from its own record
(tests/integration/test_parallel_stages.py); here, what the view says without those records (the
failed job deleted), and an entry written before the summary."""

from __future__ import annotations

import json

from relevo_core.recovery.dead_letters import describe

SUMMARY = {
    "stage": "test",
    "stage_index": 1,
    "shards": 45,
    "failed_count": 3,
    "failed_shards": [4, 9, 44],
    "first_failed_shard": 4,
    "error_class": "Relevo.Fatal.ExitCode",
    "reason": "3 of 45 shards failed, the first (shard 4) with Relevo.Fatal.ExitCode",
    "shard_failures": "each failed shard's error class, attempts, backoff and cause are on its own record",
}


def entry(cause: str) -> dict:
    return {
        "job_id": "job_1",
        "project": "app",
        "state": "open",
        "error": "Relevo.Fatal.ExitCode",
        "cause": cause,
        "job_record": {"last_successful_stage": {"S": "build"}},
    }


def test_without_the_records_every_failed_shard_is_still_named_and_the_first_with_its_class():
    # Given: a summary's entry whose job's records are gone (no table to read them from)
    # When: an operator reads it
    described = describe(entry(json.dumps(SUMMARY)))

    # Then: the stage, each failed shard, the first one's class, and why the others' are not there
    assert (described["failed_stage"], described["failed_shards"], described["last_successful_stage"]) == (
        "test",
        [4, 9, 44],
        "build",
    )
    assert [(f["shard"], f["error_class"]) for f in described["shard_failures"]] == [
        (4, "Relevo.Fatal.ExitCode"),
        (9, None),
        (44, None),
    ]
    assert {f["cause"] for f in described["shard_failures"]} == {"its record is gone (the job was deleted)"}


def test_an_entry_written_before_the_summary_still_lists_each_failed_shards_detail():
    # Given: the earlier cause, a list of each failed shard's {Error, Cause}, each Cause its detail
    details = [
        {
            "stage": "test",
            "stage_index": 1,
            "shard": shard,
            "error_class": error,
            "cause": "{}",
            "attempts": 2,
            "cumulative_backoff_sec": 3,
        }
        for shard, error in ((2, "Relevo.Fatal.Checksum"), (0, "Relevo.Fatal.ExitCode"))
    ]
    old = [{"Error": d["error_class"], "Cause": json.dumps(d)} for d in details]

    # When / Then: read as before
    described = describe(entry(json.dumps(old)))
    assert described["failed_shards"] == [0, 2]
    assert [(f["shard"], f["error_class"], f["attempts"]) for f in described["shard_failures"]] == [
        (0, "Relevo.Fatal.ExitCode", 2),
        (2, "Relevo.Fatal.Checksum", 2),
    ]
