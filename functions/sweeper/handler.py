"""Every minute (EventBridge schedule): count each region's online agents (metric OnlineAgents,
dimension Region) and record a region's change to or from none online (agents_offline), start
any accepted job whose execution never started, end the jobs of executions stopped, aborted or
timed out outside Relevo (final status, queue slot back), free project locks and waiting places
held by executions that have ended, and decide the DLQ freeze of newly dead-lettered idempotency
keys."""

from datetime import UTC, datetime

from relevo_core.config.sweeper import sweeper_settings
from relevo_core.observability import lambda_entry
from relevo_core.recovery.sweeper import sweep_minute


@lambda_entry(correlation_id_path=None, emits_metrics=True)
def lambda_handler(event, context):
    return sweep_minute(sweeper_settings(), datetime.now(UTC))
