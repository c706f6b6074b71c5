"""One logger, tracer and metrics set for every function (Powertools)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger()
# Relevo's functions call AWS through botocore only: patch that, not the X-Ray SDK's default list
# (which imports requests, httplib and others just to patch them, at every cold start).
tracer = Tracer(patch_modules=("botocore",))
metrics = Metrics()

# Every log line of a request about a job carries the job id as its correlation id, so one
# CloudWatch Logs Insights query on correlation_id follows a job across functions; requests
# about no job fall back to API Gateway's request id.
API_CORRELATION_PATH = "pathParameters.job_id || requestContext.requestId"


Handler = Callable[[Any, Any], Any]


def lambda_entry(
    correlation_id_path: str | None = API_CORRELATION_PATH, emits_metrics: bool = False
) -> Callable[[Handler], Handler]:
    """Every function's `lambda_handler` is wrapped by this, and only this: its log lines carry
    the Lambda context and the correlation id found at `correlation_id_path` in the event (for
    the API routes, the job id of the path, else API Gateway's request id; None where an event
    is about no one job), the invocation is traced, and with `emits_metrics` its metrics are
    flushed as one EMF document when it returns."""

    def wrap(handler: Handler) -> Handler:
        if emits_metrics:
            handler = metrics.log_metrics(handler)
        handler = tracer.capture_lambda_handler(handler)
        return logger.inject_lambda_context(handler, correlation_id_path=correlation_id_path)

    return wrap


def correlate(job_id: str) -> None:
    """From here on this invocation's log lines belong to `job_id` (known only after intake)."""
    logger.set_correlation_id(job_id)
    logger.append_keys(job_id=job_id)
