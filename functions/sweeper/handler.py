"""Every minute (EventBridge schedule): start any accepted job whose execution never started, end
the jobs of executions stopped, aborted or timed out outside Relevo (final status, queue slot
back), free project locks and waiting places held by executions that have ended, and decide the
DLQ freeze of newly dead-lettered idempotency keys."""

from datetime import datetime, timezone

from aws_lambda_powertools.metrics import MetricUnit

from relevo_core.config import sweeper_settings
from relevo_core.observability import logger, metrics, tracer
from relevo_core.sweeper import sweep


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event, context):
    settings = sweeper_settings()
    report = sweep(settings, datetime.now(timezone.utc), settings.notification_topic_arn)
    metrics.add_metric(name="ForgottenJobsStarted", unit=MetricUnit.Count, value=len(report.started))
    metrics.add_metric(name="ProjectLocksFreed", unit=MetricUnit.Count, value=len(report.locks_freed))
    metrics.add_metric(name="JobsEndedOutside", unit=MetricUnit.Count, value=len(report.jobs_ended))
    metrics.add_metric(name="IdempotencyKeysFrozen", unit=MetricUnit.Count, value=len(report.keys_frozen))
    if report.started or report.jobs_ended or report.locks_freed or report.waiters_dropped or report.keys_frozen:
        logger.warning("sweep repaired state", extra=report.to_dict())
    return report.to_dict()
