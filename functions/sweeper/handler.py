"""Every minute (EventBridge schedule): count each region's online agents (metric OnlineAgents,
dimension Region), start any accepted job whose execution never started, end the jobs of
executions stopped, aborted or timed out outside Relevo (final status, queue slot back), free
project locks and waiting places held by executions that have ended, and decide the DLQ freeze
of newly dead-lettered idempotency keys."""

from datetime import datetime, timezone

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from relevo_core.config.sweeper import sweeper_settings
from relevo_core.observability import logger, metrics, tracer
from relevo_core.recovery.sweeper import online_agent_counts, sweep


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event, context):
    settings = sweeper_settings()
    now = datetime.now(timezone.utc)
    # Counted and flushed first, one document per region: a repair below that fails must not
    # silence the counts, which the zero-online alarm would read as an empty fleet.
    fleet = online_agent_counts(settings.table_name, settings.regions, now)
    for region, count in fleet.items():
        with single_metric(name="OnlineAgents", unit=MetricUnit.Count, value=count, namespace=metrics.namespace) as metric:
            metric.add_dimension(name="Region", value=region)
    report = sweep(settings, now, settings.notification_topic_arn)
    metrics.add_metric(name="ForgottenJobsStarted", unit=MetricUnit.Count, value=len(report.started))
    metrics.add_metric(name="ProjectLocksFreed", unit=MetricUnit.Count, value=len(report.locks_freed))
    metrics.add_metric(name="JobsEndedOutside", unit=MetricUnit.Count, value=len(report.jobs_ended))
    metrics.add_metric(name="IdempotencyKeysFrozen", unit=MetricUnit.Count, value=len(report.keys_frozen))
    if report.started or report.jobs_ended or report.locks_freed or report.waiters_dropped or report.keys_frozen:
        logger.warning("sweep repaired state", extra=report.to_dict())
    return {**report.to_dict(), "online_agents": fleet}
