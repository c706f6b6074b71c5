"""GET /run, a project's branches and tags, and starting a run."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relevo_cli.api import ApiError
from relevo_cli.console import refs
from relevo_cli.console.render import api_answer, error_page, json_object, page, refusal
from relevo_cli.console.state import Console
from relevo_cli.console.views.run import run_context, start_run


async def run_page(request: Request) -> Response:
    console: Console = request.app.state.console
    query = request.query_params
    try:
        context = await run_in_threadpool(
            run_context, console, query.get("project"), query.get("group") or None
        )
    except ApiError as exc:
        return error_page(exc)
    return page("run.html", **context)


async def project_refs(request: Request) -> Response:
    console: Console = request.app.state.console
    try:
        project = await run_in_threadpool(console.api.get_project, request.path_params["project_id"])
    except ApiError as exc:
        return refusal(exc)
    return JSONResponse(
        await run_in_threadpool(refs.list_refs, refs.remote_url(project, console.git_base_url))
    )


async def run_submit(request: Request) -> Response:
    console: Console = request.app.state.console
    body = await json_object(request)
    if isinstance(body, Response):
        return body
    return await api_answer(start_run, console.api, request.path_params["project_id"], body)


ROUTES = [
    Route("/run", run_page),
    Route("/projects/{project_id}/refs", project_refs),
    Route("/projects/{project_id}/run", run_submit, methods=["POST"]),
]
