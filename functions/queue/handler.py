"""GET /queue (queued jobs of the projects the caller may view, in run order, and the fleet's
agents), POST /jobs/{job_id}/promote and /priority (manage; queued jobs only) and
DELETE /jobs/{job_id} (manage; ended jobs only, with their logs and artifact records), and the
fleet's pauses: POST /agents/{agent_id}/pause|resume, /regions/{region}/pause|resume (the
stack's admins) — IAM."""

from datetime import UTC, datetime
from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from relevo_core.config.queue import queue_settings
from relevo_core.fleet.pauses import pause_agent, pause_dispatch, resume_agent, resume_dispatch
from relevo_core.http import caller_arn, json_body, json_response, register_error_handlers
from relevo_core.jobs.queue import caller_queue, delete_job, promote_job, set_job_priority
from relevo_core.models.access import Level
from relevo_core.models.requests import PauseRequest, PriorityRequest
from relevo_core.observability import correlate, lambda_entry
from relevo_core.projects.permissions import requires

app = APIGatewayRestResolver()
register_error_handlers(app)


def _now() -> datetime:
    return datetime.now(UTC)


@app.get("/queue")
def queue():
    return json_response(HTTPStatus.OK, caller_queue(queue_settings(), caller_arn(app), _now()))


@app.post("/jobs/<job_id>/promote", middlewares=[requires(Level.MANAGE)])
def promote(job_id: str):
    correlate(job_id)
    return json_response(
        HTTPStatus.OK, promote_job(queue_settings().table_name, job_id, caller_arn(app), _now())
    )


@app.post("/jobs/<job_id>/priority", middlewares=[requires(Level.MANAGE)])
def priority(job_id: str):
    correlate(job_id)
    request = PriorityRequest.from_body(json_body(app))
    return json_response(
        HTTPStatus.OK, set_job_priority(queue_settings().table_name, job_id, request, caller_arn(app), _now())
    )


@app.delete("/jobs/<job_id>", middlewares=[requires(Level.MANAGE)])
def delete(job_id: str):
    correlate(job_id)
    return json_response(
        HTTPStatus.OK, delete_job(queue_settings().table_name, job_id, caller_arn(app), _now())
    )


@app.post("/agents/<agent_id>/pause")
def pause(agent_id: str):
    request = PauseRequest.from_body(json_body(app))
    return json_response(
        HTTPStatus.OK, pause_agent(queue_settings(), agent_id, request, caller_arn(app), _now())
    )


@app.post("/agents/<agent_id>/resume")
def resume(agent_id: str):
    region = (app.current_event.query_string_parameters or {}).get("region")
    return json_response(HTTPStatus.OK, resume_agent(queue_settings(), agent_id, region, caller_arn(app)))


@app.post("/regions/<region>/pause")
def pause_region(region: str):
    request = PauseRequest.from_body(json_body(app))
    return json_response(
        HTTPStatus.OK, pause_dispatch(queue_settings(), region, request, caller_arn(app), _now())
    )


@app.post("/regions/<region>/resume")
def resume_region(region: str):
    return json_response(HTTPStatus.OK, resume_dispatch(queue_settings(), region, caller_arn(app)))


@lambda_entry()
def lambda_handler(event, context):
    return app.resolve(event, context)
