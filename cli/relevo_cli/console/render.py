"""What every console route answers with: the Jinja2 pages (templates/, with the filters they
use), an API call's answer or its refusal passed on as it came, and the 400 for a body that is
not a JSON object."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from relevo_cli.api import ApiError
from relevo_cli.console.summary import artifact_type, format_duration
from relevo_cli.words import attempt_words, exact_time, time_ago
from relevo_core.models.status import queue_reason_words
from relevo_core.models.transfer import human_bytes

HERE = Path(__file__).resolve().parent

templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
templates.filters["duration"] = format_duration
templates.filters["thousands"] = lambda n: f"{int(n):,}"
templates.filters["artifact_type"] = artifact_type
templates.filters["human_bytes"] = lambda n: human_bytes(n or 0)
templates.filters["exact"] = exact_time
templates.filters["attempt_words"] = attempt_words
templates.filters["reason_words"] = (
    lambda reason, region=None, detail=None: queue_reason_words(reason, region, detail) if reason else ""
)
templates.filters["ago"] = lambda iso: time_ago(iso, datetime.now(UTC))
templates.filters["short_ref"] = lambda ref: next(
    (ref[len(p) :] for p in ("refs/heads/", "refs/tags/") if (ref or "").startswith(p)), ref or ""
)


def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(templates.get_template(name).render(**context), status_code=status)


def error_page(exc: ApiError) -> HTMLResponse:
    return page("error.html", status=exc.status, error=exc)


def refusal(exc: ApiError) -> JSONResponse:
    """The API's refusal of an action, its status and body as they came."""
    body = exc.body if isinstance(exc.body, dict) else {"message": str(exc.body)}
    return JSONResponse(body, status_code=exc.status)


async def api_answer(call: Callable[..., Any], *args: Any) -> Response:
    """An action's answer: what the API call returned, as JSON, or its refusal as it came. The
    call runs off the event loop."""
    try:
        result = await run_in_threadpool(call, *args)
    except ApiError as exc:
        return refusal(exc)
    return JSONResponse(result)


def no_such_action(name: str) -> JSONResponse:
    return JSONResponse({"error": "NOT_FOUND", "message": f"no action {name!r}"}, status_code=404)


def invalid(message: str) -> JSONResponse:
    return JSONResponse({"error": "VALIDATION_FAILED", "message": message}, status_code=400)


async def json_object(request: Request) -> dict[str, Any] | Response:
    """The body as a JSON object (whatever its Content-Type says), or the 400 that refuses it."""
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return invalid("(root): the body is not JSON")
    if not isinstance(body, dict):
        return invalid("(root): the body is a JSON object")
    return body
