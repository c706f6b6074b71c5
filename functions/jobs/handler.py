"""GET /jobs (filtered listing, queued jobs in run order) and GET /jobs/{job_id} (a job, its
stages and who wrote its last state) — IAM."""

from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.logging import correlation_paths

from relevo_core.config import table_settings
from relevo_core.http import json_response, register_error_handlers
from relevo_core.job_listing import JobListQuery, list_jobs
from relevo_core.observability import logger, tracer
from relevo_core.store.jobs import job_items_to_view, query_job_items

app = APIGatewayRestResolver()
register_error_handlers(app)


@app.get("/jobs")
def jobs():
    query = JobListQuery.from_query_string(app.current_event.query_string_parameters)
    return json_response(HTTPStatus.OK, list_jobs(table_settings().table_name, query))


@app.get("/jobs/<job_id>")
def show_job(job_id: str):
    logger.append_keys(job_id=job_id)
    return json_response(HTTPStatus.OK, job_items_to_view(query_job_items(table_settings().table_name, job_id)))


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
def lambda_handler(event, context):
    return app.resolve(event, context)
