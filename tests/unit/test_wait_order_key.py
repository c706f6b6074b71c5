"""The waiting-order key: priority desc, then queue_seq asc, then job id, as plain string order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from relevo_core.store.keys import PRIORITY_BOUND, queue_seq, wait_order


def test_order_key_sorts_by_priority_desc_then_queue_seq_then_job_id():
    t0 = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
    jobs = [
        ("a", 0, t0),
        ("b", 5, t0 + timedelta(microseconds=1)),
        ("c", PRIORITY_BOUND, t0 + timedelta(seconds=9)),
        ("d", 5, t0 + timedelta(microseconds=2)),
        ("e", -PRIORITY_BOUND, t0 - timedelta(days=3000)),
        ("f", 5, t0 + timedelta(microseconds=1)),  # same microsecond as b: the job id decides
    ]
    ordered = sorted(jobs, key=lambda job: wait_order(job[1], queue_seq(job[2]), job[0]))
    assert [job[0] for job in ordered] == ["c", "b", "f", "d", "a", "e"]


def test_queue_seq_is_enqueue_time_in_microseconds():
    assert queue_seq(datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=UTC)) == 1_000_005
