"""GET /fleet, and pausing, draining and resuming an agent or a region's dispatch."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relevo_cli.api import ApiError
from relevo_cli.console.render import api_answer, error_page, json_object, no_such_action, page
from relevo_cli.console.state import Console
from relevo_cli.console.views.fleet import fleet_context


async def fleet_page(request: Request) -> Response:
    """Agents per region: online or offline, last seen, capacity used, running stages, version;
    and a region's dispatch pause, with its note and until."""
    console: Console = request.app.state.console
    try:
        view = await run_in_threadpool(console.api.queue)
        caller = await run_in_threadpool(console.caller_arn)
    except ApiError as exc:
        return error_page(exc)
    return page("fleet.html", **fleet_context(view, caller))


async def fleet_action(request: Request) -> Response:
    """Pause, drain or resume an agent (POST /agents/{id}/pause, /resume), pause or resume a
    region's dispatch (POST /regions/{region}/pause, /resume): the API decides, as for the CLI."""
    console: Console = request.app.state.console
    body = await json_object(request)
    if isinstance(body, Response):
        return body
    params, action = request.path_params, request.path_params["action"]
    if action not in (("pause", "drain", "resume") if "agent_id" in params else ("pause", "resume")):
        return no_such_action(action)
    pause = {"note": str(body.get("note") or ""), "timeout_sec": body.get("timeout_sec")}
    if "agent_id" in params:
        if action == "resume":
            return await api_answer(console.api.resume_agent, params["agent_id"], body.get("region") or None)
        request_body = {
            **pause,
            "drain": action == "drain",
            **({"region": body["region"]} if body.get("region") else {}),
        }
        return await api_answer(console.api.pause_agent, params["agent_id"], request_body)
    if action == "resume":
        return await api_answer(console.api.resume_region, params["region"])
    return await api_answer(console.api.pause_region, params["region"], pause)


ROUTES = [
    Route("/fleet", fleet_page),
    Route("/agents/{agent_id}/{action:str}", fleet_action, methods=["POST"]),
    Route("/regions/{region}/{action:str}", fleet_action, methods=["POST"]),
]
