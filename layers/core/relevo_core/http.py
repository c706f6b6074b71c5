"""Shared pieces of every API function: JSON responses and refusals with stable codes.

The permission middleware (`requires`) lives in relevo_core.projects.permissions: a route without IAM
authorization (the webhooks) never loads the grants, their models and their queries."""

from __future__ import annotations

import base64
import json
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver, BaseRouter

from relevo_core.models.errors import ErrorCode, RelevoError


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
    context = app.current_event.get("requestContext") or {}
    identity = context.get("identity") or {}
    arn = identity.get("userArn") or identity.get("caller")
    if not arn:
        raise RelevoError(ErrorCode.UNAUTHENTICATED, "the request carries no IAM identity")
    return str(arn)


def register_error_handlers(app: ApiGatewayResolver) -> None:
    @app.exception_handler(RelevoError)
    def _refusal(error: RelevoError) -> Response:
        return error_response(error)

    @app.not_found
    def _not_found(_: Exception) -> Response:
        return json_response(
            HTTPStatus.NOT_FOUND, {"error": ErrorCode.ROUTE_NOT_FOUND.value, "message": "no such route"}
        )
