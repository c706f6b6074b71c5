"""GET /jobs/{id}/tests: the job page's Tests tab (relevo_cli.console.views.job_tests), paged by
the API's token in the link (`?status=failed&page_token=…`)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relevo_cli.api import ApiError
from relevo_cli.console.render import error_page, invalid, page
from relevo_cli.console.state import Console
from relevo_cli.console.views.job_tests import FILTERS, place, tests_tab_context


async def job_tests_tab(request: Request) -> Response:
    console: Console = request.app.state.console
    status = request.query_params.get("status") or None
    if status is not None and status not in FILTERS:
        return invalid(f"status: one of {', '.join(FILTERS)}")
    try:
        context = await run_in_threadpool(
            tests_tab_context,
            console,
            request.path_params["job_id"],
            status,
            request.query_params.get("page_token") or None,
        )
    except ApiError as exc:
        return error_page(exc)
    return page("job_tests.html", place=place, **context)


ROUTES = [Route("/jobs/{job_id}/tests", job_tests_tab)]
