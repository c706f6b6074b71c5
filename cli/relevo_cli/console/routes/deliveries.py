"""The console's deliveries page (GET /deliveries?project=&failed=): what Relevo answered each
webhook delivery, and every commit status and notification it sent, as `relevo delivery list`."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relevo_cli.api import ApiError
from relevo_cli.console.render import error_page, page


async def deliveries_page(request: Request) -> Response:
    project = request.query_params.get("project") or None
    failed = request.query_params.get("failed") in ("1", "true", "on")
    try:
        listed = await run_in_threadpool(request.app.state.console.api.deliveries, project, failed)
    except ApiError as exc:
        return error_page(exc)
    return page("deliveries.html", deliveries=listed["deliveries"], project=project, failed=failed)


ROUTES = [Route("/deliveries", deliveries_page)]
