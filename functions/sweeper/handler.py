"""Every minute (EventBridge schedule): start any accepted job whose execution never started, and
free project locks held by executions that have ended."""

from datetime import datetime, timezone

from aws_lambda_powertools.metrics import MetricUnit

from relevo_core.config import intake_settings
from relevo_core.observability import logger, metrics, tracer
from relevo_core.sweeper import sweep


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event, context):
    report = sweep(intake_settings(), datetime.now(timezone.utc))
    metrics.add_metric(name="ForgottenJobsStarted", unit=MetricUnit.Count, value=len(report.started))
    metrics.add_metric(name="ProjectLocksFreed", unit=MetricUnit.Count, value=len(report.locks_freed))
    if report.started or report.locks_freed:
        logger.warning("sweep repaired state", extra=report.to_dict())
    return report.to_dict()
