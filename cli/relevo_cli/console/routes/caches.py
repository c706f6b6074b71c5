"""GET /caches, GET /projects/{id}/caches (a project's cache entries in a region), and deleting one
entry (POST /projects/{id}/caches/delete, the API's DELETE /projects/{id}/caches/entry)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relevo_cli.api import ApiError
from relevo_cli.console.render import api_answer, error_page, invalid, json_object, page
from relevo_cli.console.state import Console
from relevo_cli.console.views.caches import caches_context, projects_context


async def projects_page(request: Request) -> Response:
    console: Console = request.app.state.console
    try:
        context = await run_in_threadpool(projects_context, console)
    except ApiError as exc:
        return error_page(exc)
    return page("cache_projects.html", **context)


async def caches_page(request: Request) -> Response:
    console: Console = request.app.state.console
    region = request.query_params.get("region") or None
    try:
        context = await run_in_threadpool(caches_context, console, request.path_params["project_id"], region)
    except ApiError as exc:
        return error_page(exc)
    return page("caches.html", **context)


async def delete_entry(request: Request) -> Response:
    """The body's `key` and `region` passed to the API, which checks both (and the caller's level)."""
    console: Console = request.app.state.console
    body = await json_object(request)
    if isinstance(body, Response):
        return body
    key, region = body.get("key"), body.get("region")
    if not isinstance(key, str) or not isinstance(region, str):
        return invalid("key, region: give the entry's key and its region as strings")
    return await api_answer(console.api.delete_cache_entry, request.path_params["project_id"], key, region)


ROUTES = [
    Route("/caches", projects_page),
    Route("/projects/{project_id}/caches", caches_page),
    Route("/projects/{project_id}/caches/delete", delete_entry, methods=["POST"]),
]
