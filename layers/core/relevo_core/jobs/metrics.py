"""Operational metrics derived from the table's change stream.

Job and stage records already mirror every execution (the state machine and the agents write
them), so the metrics are read off their changes instead of being emitted from a dozen places:
a job reaching a terminal status counts its outcome and duration; a stage claimed gives the
handoff latency (dispatch to claim); a stage finished gives its retries and cross-region bytes,
and each of its caches' restores a CacheHitRatio point of its project (100 for a hit, 0 for a
partial hit or a miss: the CloudWatch average is the share of exact hits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from relevo_core.models.status import JobStatus, StageStatus
from relevo_core.store.keys import JOB_SK, is_stage_sk

_TERMINAL_JOB = {status.value for status in JobStatus if status.terminal}
_FINISHED_STAGE = {StageStatus.SUCCEEDED.value, StageStatus.WARNING.value, StageStatus.FAILED.value}
_OUTCOME_METRIC = {
    JobStatus.SUCCEEDED.value: "JobsSucceeded",
    JobStatus.FAILED.value: "JobsFailed",
    JobStatus.CANCELED.value: "JobsCanceled",
}


@dataclass(frozen=True)
class MetricPoint:
    name: str
    unit: str  # a CloudWatch unit name: Count, Milliseconds, Bytes
    value: float
    # (name, value) pairs: a point with dimensions is its own metric per value (CacheHitRatio by
    # Project); one without is the service's.
    dimensions: tuple[tuple[str, str], ...] = ()


def _millis_between(start: Any, end: Any) -> float | None:
    try:
        began, ended = datetime.fromisoformat(str(start)), datetime.fromisoformat(str(end))
    except (TypeError, ValueError):
        return None
    if began.tzinfo is None or ended.tzinfo is None:
        return None
    return max(0.0, (ended - began).total_seconds() * 1000)


def metrics_for_change(
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    project_of: Callable[[str], str | None] = lambda _job_id: None,
) -> list[MetricPoint]:
    """The metric points one table change stands for (none for most changes). `project_of` gives
    a job's project (a stage record does not hold it): read only for a finished stage with caches."""
    if not new:
        return []  # a removal (TTL expiry, job deletion) is not an operational event
    old = old or {}
    sk = str(new.get("sk", ""))
    if sk == JOB_SK:
        return _job_metrics(old, new)
    if is_stage_sk(sk):
        return _stage_metrics(old, new, project_of)
    return []


def _job_metrics(old: dict[str, Any], new: dict[str, Any]) -> list[MetricPoint]:
    status = new.get("status")
    if status not in _TERMINAL_JOB or old.get("status") in _TERMINAL_JOB:
        return []
    points = [MetricPoint(_OUTCOME_METRIC[status], "Count", 1)]
    duration = _millis_between(new.get("created_at"), new.get("ended_at") or new.get("updated_at"))
    if duration is not None:
        points.append(MetricPoint("JobDurationMs", "Milliseconds", duration))
    return points


def _stage_metrics(
    old: dict[str, Any], new: dict[str, Any], project_of: Callable[[str], str | None]
) -> list[MetricPoint]:
    points: list[MetricPoint] = []
    claimed = new.get("status") == StageStatus.RUNNING.value and (
        old.get("status") != StageStatus.RUNNING.value or old.get("attempt") != new.get("attempt")
    )
    if claimed:
        latency = _millis_between(new.get("dispatched_at"), new.get("started_at"))
        if latency is not None:
            points.append(MetricPoint("HandoffLatencyMs", "Milliseconds", latency))
    finished = new.get("status") in _FINISHED_STAGE and old.get("status") not in _FINISHED_STAGE
    if finished:
        points.append(MetricPoint("RetryCount", "Count", float(new.get("retry_count") or 0)))
        if new.get("cross_region_bytes"):
            points.append(MetricPoint("CrossRegionBytes", "Bytes", float(new["cross_region_bytes"])))
        points += _cache_points(new, project_of)
    return points


def _cache_points(stage: dict[str, Any], project_of: Callable[[str], str | None]) -> list[MetricPoint]:
    """CacheHitRatio, by Project: one point per cache the attempt restored (or tried to)."""
    restores = [cache.get("restore") for cache in stage.get("caches") or [] if isinstance(cache, dict)]
    if not restores:
        return []
    project = project_of(str(stage.get("pk", "")).removeprefix("STAGES#"))
    if not project:
        return []
    return [
        MetricPoint("CacheHitRatio", "Percent", 100.0 if restore == "hit" else 0.0, (("Project", project),))
        for restore in restores
    ]
