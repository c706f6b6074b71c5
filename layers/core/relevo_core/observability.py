"""One logger, tracer and metrics set for every function (Powertools)."""

from __future__ import annotations

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


def correlate(job_id: str) -> None:
    """From here on this invocation's log lines belong to `job_id` (known only after intake)."""
    logger.set_correlation_id(job_id)
    logger.append_keys(job_id=job_id)
