"""GET /dlq, and its redrive and unfreeze buttons."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relevo_cli.api import ApiError
from relevo_cli.console.render import api_answer, error_page, page
from relevo_cli.console.state import Console
from relevo_cli.console.views.dlq import dlq_context


async def dlq_page(request: Request) -> Response:
    console: Console = request.app.state.console
    try:
        context = await run_in_threadpool(dlq_context, console)
    except ApiError as exc:
        return error_page(exc)
    return page("dlq.html", **context)


async def dlq_action(request: Request) -> Response:
    """Redrive (POST /dlq/{job_id}/redrive) or unfreeze (POST /dlq/keys/{key}/unfreeze)."""
    console: Console = request.app.state.console
    params = request.path_params
    if "key" in params:
        return await api_answer(console.api.unfreeze_key, params["key"])
    return await api_answer(console.api.redrive, params["job_id"])


ROUTES = [
    Route("/dlq", dlq_page),
    Route("/dlq/keys/{key:path}/unfreeze", dlq_action, methods=["POST"]),
    Route("/dlq/{job_id}/redrive", dlq_action, methods=["POST"]),
]
