"""GET /jobs/{job_id}: a job, its stages and who wrote its last state (IAM, view)."""

from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.logging import correlation_paths

from relevo_core.config import table_settings
from relevo_core.http import json_response, register_error_handlers, requires
from relevo_core.models.access import Level
from relevo_core.observability import logger, tracer
from relevo_core.store.jobs import job_items_to_view, query_job_items

app = APIGatewayRestResolver()
register_error_handlers(app)


@app.get("/jobs/<job_id>", middlewares=[requires(Level.VIEW)])
def show_job(job_id: str):
    logger.append_keys(job_id=job_id)
    return json_response(HTTPStatus.OK, job_items_to_view(query_job_items(table_settings().table_name, job_id)))


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
def lambda_handler(event, context):
    return app.resolve(event, context)
