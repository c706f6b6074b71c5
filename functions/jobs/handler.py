"""GET /jobs (filtered listing, queued jobs in run order; only projects the caller may view),
GET /jobs/{job_id} (a job, its stages and who wrote its last state; view) and
GET /jobs/{job_id}/cost (what its execution cost; view) — IAM."""

from datetime import UTC, datetime
from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from relevo_core.config import access_settings, execution_settings, table_settings
from relevo_core.http import caller_arn, json_response, register_error_handlers
from relevo_core.jobs.cost import job_cost
from relevo_core.jobs.listing import caller_jobs
from relevo_core.jobs.view import show_job
from relevo_core.models.access import Level
from relevo_core.models.requests import JobListQuery
from relevo_core.observability import correlate, lambda_entry
from relevo_core.projects.permissions import requires

app = APIGatewayRestResolver()
register_error_handlers(app)


@app.get("/jobs")
def jobs():
    query = JobListQuery.from_query_string(app.current_event.query_string_parameters)
    return json_response(HTTPStatus.OK, caller_jobs(access_settings(), caller_arn(app), query))


@app.get("/jobs/<job_id>", middlewares=[requires(Level.VIEW)])
def get_job(job_id: str):
    correlate(job_id)
    return json_response(HTTPStatus.OK, show_job(table_settings().table_name, job_id, datetime.now(UTC)))


@app.get("/jobs/<job_id>/cost", middlewares=[requires(Level.VIEW)])
def get_job_cost(job_id: str):
    correlate(job_id)
    return json_response(HTTPStatus.OK, job_cost(execution_settings().machines, job_id))


@lambda_entry()
def lambda_handler(event, context):
    return app.resolve(event, context)
