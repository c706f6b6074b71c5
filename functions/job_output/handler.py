"""GET /jobs/{job_id}/logs (page forward with from_seq, back with before_seq),
GET /jobs/{job_id}/artifacts/{name} (a presigned download link valid 2 minutes) and
GET /jobs/{job_id}/tests (its tests merged across stages and shards, paged) — IAM, view."""

from datetime import UTC, datetime
from http import HTTPStatus
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import APIGatewayRestResolver

from relevo_core.config import table_settings
from relevo_core.http import json_response, register_error_handlers
from relevo_core.jobs.artifacts import artifact_link
from relevo_core.jobs.log_page import log_page
from relevo_core.jobs.results_listing import show_job_tests
from relevo_core.models.access import Level
from relevo_core.models.requests import ArtifactQuery, JobTestsQuery, LogQuery, parse_query
from relevo_core.observability import correlate, lambda_entry
from relevo_core.projects.permissions import requires

app = APIGatewayRestResolver()
register_error_handlers(app)


@app.get("/jobs/<job_id>/logs", middlewares=[requires(Level.VIEW)])
def logs(job_id: str):
    correlate(job_id)
    query = parse_query(LogQuery, app.current_event.query_string_parameters)
    return json_response(HTTPStatus.OK, log_page(table_settings().table_name, job_id, query))


@app.get("/jobs/<job_id>/artifacts/<name>", middlewares=[requires(Level.VIEW)])
def artifact(job_id: str, name: str):
    correlate(job_id)
    query = parse_query(ArtifactQuery, app.current_event.query_string_parameters)
    # A name under a subdirectory holds '/': the client percent-encodes it, and API Gateway
    # (REST) hands path parameters over still encoded.
    link = artifact_link(
        table_settings().table_name,
        job_id,
        unquote(name),
        query.stage,
        datetime.now(UTC),
        query.shard,
    )
    return json_response(HTTPStatus.OK, link)


@app.get("/jobs/<job_id>/tests", middlewares=[requires(Level.VIEW)])
def tests(job_id: str):
    correlate(job_id)
    query = parse_query(JobTestsQuery, app.current_event.query_string_parameters)
    return json_response(HTTPStatus.OK, show_job_tests(table_settings().table_name, job_id, query))


@lambda_entry()
def lambda_handler(event, context):
    return app.resolve(event, context)
