"""POST /projects/{project_id}/run, POST /jobs/{job_id}/rerun, /release and /cancel (IAM)."""

from http import HTTPStatus

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.logging import correlation_paths

from relevo_core.cancel import cancel_job
from relevo_core.config import intake_settings
from relevo_core.http import caller_arn, json_body, json_response, register_error_handlers
from relevo_core.intake import IntakeResult
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


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
def lambda_handler(event, context):
    return app.resolve(event, context)
