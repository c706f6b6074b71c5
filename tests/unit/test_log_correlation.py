"""API functions log with the job id as correlation id when the request names a job, and with
API Gateway's request id otherwise."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

from relevo_core.observability import API_CORRELATION_PATH, correlate, logger

CONTEXT = SimpleNamespace(
    function_name="f",
    memory_limit_in_mb=256,
    invoked_function_arn="arn:aws:lambda:us-east-1:1:function:f",
    aws_request_id="r",
)


@logger.inject_lambda_context(correlation_id_path=API_CORRELATION_PATH, clear_state=True)
def handler(event, context):
    if event.get("accepted_job"):
        correlate(event["accepted_job"])
    logger.info("handled")


@pytest.fixture()
def log_lines():
    """The shared logger's handler was bound to stdout at import: point it at a buffer."""
    buffer = io.StringIO()
    previous = logger.registered_handler.setStream(buffer)
    try:
        yield lambda: [json.loads(line) for line in buffer.getvalue().splitlines()]
    finally:
        logger.registered_handler.setStream(previous)


@pytest.mark.parametrize(
    "event, correlation_id",
    [
        ({"pathParameters": {"job_id": "job_1"}, "requestContext": {"requestId": "req-1"}}, "job_1"),
        ({"pathParameters": {"project_id": "p"}, "requestContext": {"requestId": "req-2"}}, "req-2"),
        ({"pathParameters": None, "requestContext": {"requestId": "req-3"}}, "req-3"),
        ({"requestContext": {"requestId": "req-4"}, "accepted_job": "job_new"}, "job_new"),
    ],
)
def test_correlation_id_is_the_job_when_there_is_one(event, correlation_id, log_lines):
    handler(event, CONTEXT)
    assert log_lines()[-1]["correlation_id"] == correlation_id
