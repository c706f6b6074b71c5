"""GET /jobs (filtered listing, queued jobs in run order; only projects the caller may view) and
GET /jobs/{job_id} (a job, its stages and who wrote its last state; view) — IAM."""

from datetime import datetime, timezone
from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from relevo_core.config import access_settings, table_settings
from relevo_core.http import caller_arn, json_response, register_error_handlers
from relevo_core.jobs.listing import list_jobs
from relevo_core.models.requests import JobListQuery
from relevo_core.jobs.view import show_job
from relevo_core.models.access import Level
from relevo_core.observability import API_CORRELATION_PATH, correlate, logger, tracer
from relevo_core.projects.permissions import requires, visibility

app = APIGatewayRestResolver()
register_error_handlers(app)


@app.get("/jobs")
def jobs():
    query = JobListQuery.from_query_string(app.current_event.query_string_parameters)
    can = visibility(access_settings(), caller_arn(app))
    return json_response(HTTPStatus.OK, list_jobs(table_settings().table_name, query, can_view=can.view))


@app.get("/jobs/<job_id>", middlewares=[requires(Level.VIEW)])
def get_job(job_id: str):
    correlate(job_id)
    return json_response(HTTPStatus.OK, show_job(table_settings().table_name, job_id, datetime.now(timezone.utc)))


@logger.inject_lambda_context(correlation_id_path=API_CORRELATION_PATH)
@tracer.capture_lambda_handler
def lambda_handler(event, context):
    return app.resolve(event, context)
