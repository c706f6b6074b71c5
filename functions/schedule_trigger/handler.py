"""EventBridge Scheduler target: one project schedule's slot in, at most one job out."""

from relevo_core.config import intake_settings
from relevo_core.intake.schedules import fire_schedule
from relevo_core.observability import lambda_entry


@lambda_entry(correlation_id_path=None)
def lambda_handler(event, context):
    result = fire_schedule(intake_settings(), event)
    return result.body() if result else {"ignored": True}
