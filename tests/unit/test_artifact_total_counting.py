"""What one artifact record's change adds to its project's running total (artifact.max_total_bytes),
read off the stream record's OLD and NEW images, and which project it belongs to."""

from __future__ import annotations

import pytest

from relevo_core.jobs.artifact_quota import project_of_artifact, stored_delta

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


def test_the_project_is_the_key_segment_before_the_job_id():
    assert project_of_artifact("s3://bucket/hello/job_1/build/out/app.ipa", "job_1") == "hello"
    assert project_of_artifact("s3://bucket/job_1/build/app.ipa", "job_1") is None
