"""POST /projects/{project_id}/run, POST /jobs/{job_id}/rerun, /release, /cancel, /approve and
/reject, POST /jobs/{job_id}/stages/{stage}/resolve (manual review), and the dead-letter queue:
GET /dlq, GET /dlq/{job_id}, POST /dlq/{job_id}/redrive, POST /dlq/keys/{key}/unfreeze (IAM).
Each route declares the level it needs on the project (view < operate < manage)."""

from http import HTTPStatus
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from relevo_core.config import access_settings, execution_settings, intake_settings, table_settings
from relevo_core.http import caller_arn, json_body, json_response, register_error_handlers
from relevo_core.intake.enqueue import IntakeResult
from relevo_core.intake.triggers import release_job, rerun_job, run_project
from relevo_core.jobs.approvals import answer_approval
from relevo_core.jobs.cancel import cancel_job
from relevo_core.jobs.resolve import resolve_stage
from relevo_core.models.access import Level
from relevo_core.models.errors import ErrorCode
from relevo_core.observability import correlate, lambda_entry
from relevo_core.projects.permissions import requires
from relevo_core.recovery.dead_letters import (
    dead_letter_overview,
    redrive_dead_letter,
    show_dead_letter,
    unfreeze_dead_letter_key,
)

app = APIGatewayRestResolver()
register_error_handlers(app)
_NO_ENTRY = ErrorCode.DLQ_ENTRY_NOT_FOUND


def _respond(result: IntakeResult):
    correlate(result.job_id)
    return json_response(HTTPStatus.OK if result.duplicate else HTTPStatus.ACCEPTED, result.body())


@app.post("/projects/<project_id>/run", middlewares=[requires(Level.OPERATE)])
def run(project_id: str):
    return _respond(run_project(intake_settings(), project_id, json_body(app), caller_arn(app)))


@app.post("/jobs/<job_id>/rerun", middlewares=[requires(Level.MANAGE)])
def rerun(job_id: str):
    return _respond(rerun_job(intake_settings(), job_id, json_body(app), caller_arn(app)))


@app.post("/jobs/<job_id>/release", middlewares=[requires(Level.OPERATE)])
def release(job_id: str):
    return _respond(release_job(intake_settings(), job_id, caller_arn(app)))


@app.post("/jobs/<job_id>/cancel", middlewares=[requires(Level.MANAGE)])
def cancel(job_id: str):
    correlate(job_id)
    return json_response(HTTPStatus.OK, cancel_job(execution_settings(), job_id, caller_arn(app)))


@app.post("/jobs/<job_id>/approve", middlewares=[requires(Level.OPERATE)])
def approve(job_id: str):
    return json_response(
        HTTPStatus.OK, answer_approval(table_settings(), job_id, True, json_body(app), caller_arn(app))
    )


@app.post("/jobs/<job_id>/reject", middlewares=[requires(Level.OPERATE)])
def reject(job_id: str):
    return json_response(
        HTTPStatus.OK, answer_approval(table_settings(), job_id, False, json_body(app), caller_arn(app))
    )


@app.post("/jobs/<job_id>/stages/<stage>/resolve", middlewares=[requires(Level.MANAGE)])
def resolve(job_id: str, stage: str):
    return json_response(
        HTTPStatus.OK, resolve_stage(table_settings(), job_id, stage, json_body(app), caller_arn(app))
    )


@app.get("/dlq")
def dead_letters():
    return json_response(HTTPStatus.OK, dead_letter_overview(access_settings(), caller_arn(app)))


@app.get("/dlq/<job_id>", middlewares=[requires(Level.VIEW, missing=_NO_ENTRY)])
def dead_letter(job_id: str):
    return json_response(HTTPStatus.OK, show_dead_letter(table_settings(), job_id))


@app.post("/dlq/<job_id>/redrive", middlewares=[requires(Level.MANAGE, missing=_NO_ENTRY)])
def redrive(job_id: str):
    return _respond(redrive_dead_letter(intake_settings(), job_id, caller_arn(app)))


@app.post("/dlq/keys/<key>/unfreeze")
def unfreeze(key: str):
    # Idempotency keys hold ':' and may hold '/': the client percent-encodes the key, and API
    # Gateway (REST) hands path parameters over still encoded.
    return json_response(
        HTTPStatus.OK, unfreeze_dead_letter_key(access_settings(), unquote(key), caller_arn(app))
    )


@lambda_entry()
def lambda_handler(event, context):
    return app.resolve(event, context)
