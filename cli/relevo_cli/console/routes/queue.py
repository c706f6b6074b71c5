"""GET /queue: the queue page."""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relevo_cli.api import ApiError
from relevo_cli.console.render import error_page, page
from relevo_cli.console.state import Console
from relevo_cli.console.views.queue import queue_context


async def queue_page(request: Request) -> Response:
    console: Console = request.app.state.console
    try:
        view = await run_in_threadpool(console.api.queue)
        context = await run_in_threadpool(queue_context, console, view, datetime.now(UTC))
    except ApiError as exc:
        return error_page(exc)
    return page("queue.html", **context)


ROUTES = [Route("/queue", queue_page)]
