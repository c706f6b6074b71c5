"""What one change of the table's stream does in the status reporter's function: its reports
(commit statuses, notices), then its metrics.

One function reads the stream for both, since Lambda reads a stream with at most two ("Concurrent
shard reads in DynamoDB Streams", Lambda Developer Guide). A record's metrics are added only once
its reports are done: a record whose reports raise is delivered again (a partial batch failure),
and its metrics then count once, on the delivery that went through.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from relevo_core.jobs.metrics import metrics_for_change
from relevo_core.notify.reporter import Reporter
from relevo_core.observability import metrics


def on_table_change(
    reporter: Reporter, old: dict[str, Any] | None, new: dict[str, Any] | None, deadline: float
) -> None:
    reporter.report_change(old, new, deadline)
    for point in metrics_for_change(old, new, lambda job_id: _project_of(reporter, job_id)):
        if not point.dimensions:
            metrics.add_metric(name=point.name, unit=point.unit, value=point.value)
            continue
        # A metric of its own per dimension value (a project's CacheHitRatio): its own EMF document.
        with single_metric(
            name=point.name, unit=MetricUnit(point.unit), value=point.value, namespace=metrics.namespace
        ) as metric:
            for name, value in point.dimensions:
                metric.add_dimension(name=name, value=value)


def _project_of(reporter: Reporter, job_id: str) -> str | None:
    project = (reporter.job_record(job_id) or {}).get("project")
    return str(project) if project else None
