"""GET /queue (queued jobs of the projects the caller may view, in run order, and the fleet's
agents), POST /jobs/{job_id}/promote and /priority (manage; queued jobs only) and
DELETE /jobs/{job_id} (manage; ended jobs only, with their logs and artifact records) — IAM."""

from datetime import datetime, timezone
from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from relevo_core.config.queue import queue_settings
from relevo_core.http import caller_arn, json_body, json_response, register_error_handlers
from relevo_core.models.access import Level
from relevo_core.observability import API_CORRELATION_PATH, logger, tracer
from relevo_core.projects.permissions import requires, visibility
from relevo_core.jobs.queue import delete_job, promote_job, queue_view, set_job_priority
from relevo_core.models.requests import PriorityRequest

app = APIGatewayRestResolver()
register_error_handlers(app)


def _now() -> datetime:
    return datetime.now(timezone.utc)


@app.get("/queue")
def queue():
    settings = queue_settings()
    can = visibility(settings, caller_arn(app))
    return json_response(HTTPStatus.OK, queue_view(settings.table_name, settings.regions, can.view, _now()))


@app.post("/jobs/<job_id>/promote", middlewares=[requires(Level.MANAGE)])
def promote(job_id: str):
    logger.append_keys(job_id=job_id)
    return json_response(HTTPStatus.OK, promote_job(queue_settings().table_name, job_id, caller_arn(app), _now()))


@app.post("/jobs/<job_id>/priority", middlewares=[requires(Level.MANAGE)])
def priority(job_id: str):
    logger.append_keys(job_id=job_id)
    request = PriorityRequest.from_body(json_body(app))
    return json_response(HTTPStatus.OK, set_job_priority(queue_settings().table_name, job_id, request, caller_arn(app), _now()))


@app.delete("/jobs/<job_id>", middlewares=[requires(Level.MANAGE)])
def delete(job_id: str):
    logger.append_keys(job_id=job_id)
    return json_response(HTTPStatus.OK, delete_job(queue_settings().table_name, job_id, caller_arn(app), _now()))


@logger.inject_lambda_context(correlation_id_path=API_CORRELATION_PATH)
@tracer.capture_lambda_handler
def lambda_handler(event, context):
    return app.resolve(event, context)
