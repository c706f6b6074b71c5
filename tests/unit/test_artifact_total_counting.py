"""What one artifact record's change adds to its project's running total (artifact.max_total_bytes),
read off the stream record's OLD and NEW images, and which project it belongs to once its job
record is gone (while it is there, the job record says: tests/integration/test_agent_written_locations.py)."""

from __future__ import annotations

import pytest

from relevo_core.jobs.artifact_quota import home_after_job, stored_delta

STORED = {"pk": "ARTIFACTS#job_1", "size": 700}
REMOVED = {**STORED, "removed_at": "2026-12-01T21:00:00+00:00", "removed_reason": "artifact.max_total_bytes"}


@pytest.mark.parametrize(
    "old, new, delta",
    [
        (None, STORED, 700),  # an upload
        (STORED, {**STORED, "size": 1000}, 300),  # a retry of the stage replaced the path
        (STORED, STORED, 0),  # a rewrite of the same file
        (STORED, None, -700),  # the job deleted, or the record expired by TTL
        (STORED, REMOVED, 0),  # removed by the quota: the remover took it off in its own transaction
        (REMOVED, None, 0),  # a removed record deleted later: already off the total
        (REMOVED, STORED, 700),  # a stage's retry wrote the path again after a removal
    ],
)
def test_a_change_adds_what_it_stores_and_takes_off_what_it_no_longer_does(old, new, delta):
    assert stored_delta(old, new) == delta


def test_once_its_job_is_gone_the_project_is_the_key_segment_before_the_job_id():
    home = home_after_job({"uri": "s3://bucket/hello/job_1/build/out/app.ipa"}, "job_1")
    assert home is not None and (home.project, home.prefix.bucket, home.prefix.prefix) == (
        "hello",
        "bucket",
        "hello/job_1/",
    )
    # Not the job's own prefix (the job id deeper down, or another job's): no project.
    for uri in (
        "s3://bucket/job_1/build/app.ipa",
        "s3://bucket/hello/other/job_1/app.ipa",
        "s3://bucket/hello/job_1x/app.ipa",
    ):
        assert home_after_job({"uri": uri}, "job_1") is None, uri
