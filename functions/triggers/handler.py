"""POST /projects/{project_id}/run, POST /jobs/{job_id}/rerun, /release, /cancel, /approve and
/reject, and the
dead-letter queue: GET /dlq, GET /dlq/{job_id}, POST /dlq/{job_id}/redrive and
POST /dlq/keys/{key}/unfreeze (IAM)."""

from http import HTTPStatus
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.logging import correlation_paths

from relevo_core.approvals import decide
from relevo_core.cancel import cancel_job
from relevo_core.config import intake_settings
from relevo_core.dead_letters import list_dead_letters, redrive_dead_letter, show_dead_letter
from relevo_core.http import caller_arn, json_body, json_response, register_error_handlers
from relevo_core.intake import IntakeResult
from relevo_core.key_freeze import list_frozen_keys, unfreeze_key
from relevo_core.observability import logger, tracer
from relevo_core.triggers import release_job, rerun_job, run_project

app = APIGatewayRestResolver()
register_error_handlers(app)


def _respond(result: IntakeResult):
    logger.append_keys(job_id=result.job_id)
    return json_response(HTTPStatus.OK if result.duplicate else HTTPStatus.ACCEPTED, result.body())


@app.post("/projects/<project_id>/run")
def run(project_id: str):
    return _respond(run_project(intake_settings(), project_id, json_body(app), caller_arn(app)))


@app.post("/jobs/<job_id>/rerun")
def rerun(job_id: str):
    return _respond(rerun_job(intake_settings(), job_id, json_body(app), caller_arn(app)))


@app.post("/jobs/<job_id>/release")
def release(job_id: str):
    return _respond(release_job(intake_settings(), job_id, caller_arn(app)))


@app.post("/jobs/<job_id>/cancel")
def cancel(job_id: str):
    logger.append_keys(job_id=job_id)
    return json_response(HTTPStatus.OK, cancel_job(intake_settings(), job_id, caller_arn(app)))


@app.post("/jobs/<job_id>/approve")
def approve(job_id: str):
    return json_response(HTTPStatus.OK, decide(intake_settings(), job_id, True, json_body(app), caller_arn(app)))


@app.post("/jobs/<job_id>/reject")
def reject(job_id: str):
    return json_response(HTTPStatus.OK, decide(intake_settings(), job_id, False, json_body(app), caller_arn(app)))


@app.get("/dlq")
def dead_letters():
    settings = intake_settings()
    entries = list_dead_letters(settings)
    return json_response(HTTPStatus.OK, {"entries": entries, "count": len(entries), "frozen_keys": list_frozen_keys(settings)})


@app.get("/dlq/<job_id>")
def dead_letter(job_id: str):
    return json_response(HTTPStatus.OK, show_dead_letter(intake_settings(), job_id))


@app.post("/dlq/<job_id>/redrive")
def redrive(job_id: str):
    return _respond(redrive_dead_letter(intake_settings(), job_id, caller_arn(app)))


@app.post("/dlq/keys/<key>/unfreeze")
def unfreeze(key: str):
    # Idempotency keys hold ':' and may hold '/': the client percent-encodes the key, and API
    # Gateway (REST) hands path parameters over still encoded.
    return json_response(HTTPStatus.OK, unfreeze_key(intake_settings(), unquote(key), caller_arn(app)))


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
def lambda_handler(event, context):
    return app.resolve(event, context)
