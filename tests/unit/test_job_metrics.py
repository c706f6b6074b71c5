"""Which table changes become which metrics (no AWS)."""

from __future__ import annotations

from relevo_core.jobs.metrics import MetricPoint, metrics_for_change

JOB = {"pk": "JOB#j1", "sk": "JOB", "created_at": "2026-11-29T10:00:00+00:00"}
STAGE = {"pk": "STAGES#j1", "sk": "STAGE#00", "dispatched_at": "2026-11-29T10:00:01.000Z"}


def _names(points: list[MetricPoint]) -> dict[str, float]:
    return {p.name: p.value for p in points}


def test_a_job_reaching_a_terminal_status_counts_its_outcome_and_duration_once():
    running = {**JOB, "status": "running"}
    ended = {**JOB, "status": "succeeded", "ended_at": "2026-11-29T10:02:30+00:00"}
    assert _names(metrics_for_change(running, ended)) == {"JobsSucceeded": 1, "JobDurationMs": 150_000}
    # A later write to an ended job (an operator note, a TTL refresh) is not a second outcome.
    assert metrics_for_change(ended, {**ended, "last_writer": "operator"}) == []
    assert _names(metrics_for_change({**JOB, "status": "queued"}, {**JOB, "status": "canceled"})) == {
        "JobsCanceled": 1
    }
    assert "JobsFailed" in _names(metrics_for_change(running, {**JOB, "status": "failed", "ended_at": "bad"}))


def test_non_terminal_job_changes_and_removals_are_not_metrics():
    assert metrics_for_change({**JOB, "status": "queued"}, {**JOB, "status": "running"}) == []
    assert metrics_for_change({**JOB, "status": "succeeded"}, None) == []
    assert metrics_for_change(None, {"pk": "DEDUP#k", "sk": "DEDUP"}) == []


def test_a_claim_gives_the_handoff_latency_from_dispatch_to_claim():
    dispatched = {**STAGE, "status": "dispatched", "attempt": 1}
    claimed = {**dispatched, "status": "running", "started_at": "2026-11-29T10:00:01.250000+00:00"}
    assert _names(metrics_for_change(dispatched, claimed)) == {"HandoffLatencyMs": 250}
    # A lease renewal of the same attempt is not a new claim; a takeover by attempt 2 is.
    assert metrics_for_change(claimed, {**claimed, "lease_expires_at": 99}) == []
    assert "HandoffLatencyMs" in _names(metrics_for_change(claimed, {**claimed, "attempt": 2}))


def test_a_finished_stage_gives_retries_and_cross_region_bytes():
    running = {**STAGE, "status": "running", "attempt": 3}
    done = {**running, "status": "succeeded", "retry_count": 2, "cross_region_bytes": 4096}
    assert _names(metrics_for_change(running, done)) == {"RetryCount": 2, "CrossRegionBytes": 4096}
    assert _names(metrics_for_change(running, {**running, "status": "failed"})) == {"RetryCount": 0}


def test_a_finished_stage_gives_each_cache_restore_a_hit_ratio_point_of_its_project():
    # Given a stage that restored one cache exactly, one from a restore key and missed a third
    running = {**STAGE, "status": "running", "attempt": 1}
    caches = [{"name": "spm", "restore": "hit"}, {"name": "pods", "restore": "partial"}]
    done = {**running, "status": "succeeded", "caches": [*caches, {"name": "gems", "restore": "miss"}]}
    asked: list[str] = []

    def project_of(job_id: str) -> str:
        asked.append(job_id)
        return "ios-app"

    # When it finishes
    points = [p for p in metrics_for_change(running, done, project_of) if p.name == "CacheHitRatio"]

    # Then each restore is a point of the job's project: 100 for the hit, 0 for the others
    assert [(p.value, p.unit, p.dimensions) for p in points] == [
        (100.0, "Percent", (("Project", "ios-app"),)),
        (0.0, "Percent", (("Project", "ios-app"),)),
        (0.0, "Percent", (("Project", "ios-app"),)),
    ]
    assert asked == ["j1"]
    # and a renewal of the finished record, or a stage without caches, counts none (nor reads the job)
    assert metrics_for_change(done, {**done, "lease_expires_at": 9}, project_of) == []
    plain = {**running, "status": "succeeded"}
    assert "CacheHitRatio" not in _names(metrics_for_change(running, plain, project_of))
    assert asked == ["j1"]
