"""POST /webhooks/github/{project_id}, /webhooks/gitlab/{project_id}: a verified Git webhook
becomes at most one job."""

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from relevo_core.config import intake_settings
from relevo_core.http import json_response, raw_body, register_error_handlers
from relevo_core.intake.webhooks.receive import receive
from relevo_core.observability import correlate, lambda_entry

app = APIGatewayRestResolver()
register_error_handlers(app)


def _answer(source: str, project_id: str):
    outcome = receive(intake_settings(), source, project_id, app.current_event.headers, raw_body(app))
    if "job_id" in outcome.body:
        correlate(outcome.body["job_id"])
    return json_response(outcome.status, outcome.body)


@app.post("/webhooks/github/<project_id>")
def github_webhook(project_id: str):
    return _answer("github", project_id)


@app.post("/webhooks/gitlab/<project_id>")
def gitlab_webhook(project_id: str):
    return _answer("gitlab", project_id)


# Each delivery's answer is counted (WebhookAccepted, WebhookDuplicates, WebhookIgnored, WebhookRefused).
@lambda_entry(emits_metrics=True)
def lambda_handler(event, context):
    return app.resolve(event, context)
