"""GET /: the job list."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relevo_cli.api import ApiError
from relevo_cli.console.render import error_page, page
from relevo_cli.console.state import Console
from relevo_cli.console.views.jobs import JOB_FILTERS, job_list_context


async def job_list(request: Request) -> Response:
    console: Console = request.app.state.console
    filters = {name: request.query_params.get(name) or None for name in JOB_FILTERS}
    try:
        context = await run_in_threadpool(job_list_context, console, filters)
    except ApiError as exc:
        return error_page(exc)
    return page("jobs.html", **context)


ROUTES = [Route("/", job_list)]
