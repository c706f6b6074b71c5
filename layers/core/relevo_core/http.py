"""Shared pieces of every API function: JSON responses and refusals with stable codes."""

from __future__ import annotations

import base64
import json
from http import HTTPStatus
from typing import Any, Callable

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import BaseRouter

from relevo_core.config import access_settings
from relevo_core.models.access import Level
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.permissions import require, require_on_job


def json_response(status: int, body: Any) -> Response:
    return Response(status_code=int(status), content_type="application/json", body=json.dumps(body))


def error_response(error: RelevoError) -> Response:
    return json_response(error.status, error.to_body())


def raw_body(app: BaseRouter) -> bytes:
    """The request body exactly as sent: webhook signatures cover these bytes, not a re-encoding."""
    event = app.current_event
    body = event.get("body") or ""
    if event.get("isBase64Encoded"):
        return base64.b64decode(body)
    return body.encode("utf-8")


def json_body(app: BaseRouter) -> Any:
    try:
        return json.loads(raw_body(app) or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RelevoError(ErrorCode.MALFORMED_JSON, f"body is not JSON: {exc}") from exc


def caller_arn(app: BaseRouter) -> str:
    """The IAM identity API Gateway authenticated (SigV4) for this request."""
    identity = app.current_event.get("requestContext", {}).get("identity", {}) or {}
    arn = identity.get("userArn") or identity.get("caller")
    if not arn:
        raise RelevoError(ErrorCode.UNAUTHENTICATED, "the request carries no IAM identity")
    return str(arn)


def requires(level: Level, missing: ErrorCode = ErrorCode.JOB_NOT_FOUND) -> Callable[..., Response]:
    """Route middleware: the caller must hold `level` on the project the route names
    ({project_id}) or on the project of the job it names ({job_id}); otherwise 403 FORBIDDEN
    and the route never runs. `missing` is what an admin gets for a job that does not exist."""

    def check_permission(app: BaseRouter, next_middleware: Callable[..., Response]) -> Response:
        parameters = app.current_event.path_parameters or {}
        caller = caller_arn(app)
        if "project_id" in parameters:
            require(access_settings(), caller, parameters["project_id"], level)
        else:
            require_on_job(access_settings(), caller, parameters["job_id"], level, missing)
        return next_middleware(app)

    return check_permission


def register_error_handlers(app: BaseRouter) -> None:
    @app.exception_handler(RelevoError)
    def _refusal(error: RelevoError) -> Response:
        return error_response(error)

    @app.not_found
    def _not_found(_: Exception) -> Response:
        return json_response(HTTPStatus.NOT_FOUND, {"error": ErrorCode.ROUTE_NOT_FOUND.value, "message": "no such route"})
