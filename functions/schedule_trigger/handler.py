"""EventBridge Scheduler target: one project schedule's slot in, at most one job out."""

from relevo_core.config import intake_settings
from relevo_core.observability import logger, tracer
from relevo_core.intake.schedules import fire_schedule


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event, context):
    result = fire_schedule(intake_settings(), event)
    return result.body() if result else {"ignored": True}
