"""The console's Starlette app: pages rendered from the API's answers, the live-log stream, and
the actions, each a call of RelevoApi (relevo_cli.api), signed with the operator's credentials.

Nothing here decides what a caller may do: a refusal is the API's (its status and body are passed
on), and the buttons' enabled state is only a probe of it (relevo_cli.console.actions). The app
takes the API it talks to as an argument, so the same pages can later sit behind another
authentication (a per-user RelevoApi) without a rewrite.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from datetime import datetime, timezone
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import anyio
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.background import BackgroundTask
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.artifacts import ChecksumMismatch
from relevo_cli.console import actions, archive, refs
from relevo_cli.console.deliveries import deliveries_page
from relevo_cli.console.security import ConsoleSecrets, guarded
from relevo_cli.console.stream import StreamSettings, job_events
from relevo_core.models.transfer import human_bytes
from relevo_cli.console.summary import artifact_type, format_duration, job_summary, seconds_between
from relevo_core.models.requests import LOG_MAX_LIMIT
from relevo_core.models.status import queue_reason_words
from relevo_cli.words import attempt_words, exact_time, time_ago

HERE = Path(__file__).resolve().parent
LOG_TAIL_LINES = 200
# The job page keeps the newest this many log lines (static/job.js reads it from the page).
LOG_MAX_LINES = 5000
# Chunks per page when the page's first view is read back from the end of the log.
TAIL_PAGE_CHUNKS = 20
# A job's cost is read from its execution history (GET /jobs/{id}/cost pages through
# GetExecutionHistory), the panel's slowest read, and the panel re-renders on every state event
# while the page streams the log. The history grows as the job moves (a status, a stage's status
# or attempt): a cost is kept for the job as it was read, for at most JOB_COST_MAX_AGE_SEC (a
# queued job's wait cycles add transitions without moving it), for the last JOB_COSTS_KEPT jobs.
JOB_COST_MAX_AGE_SEC = 30.0
JOB_COSTS_KEPT = 256


@dataclass
class Console:
    """What the console's routes share: the API, who it signs as, and the stream's settings."""

    api: RelevoApi
    settings: StreamSettings = field(default_factory=StreamSettings)
    caller: Callable[[], str] | None = None
    # Where `git ls-remote` finds a project's repository (None: GitHub's or GitLab's).
    git_base_url: str | None = None
    clock: Callable[[], float] = time.monotonic
    _caller_arn: str | None = None
    _costs: OrderedDict[str, tuple[tuple[Any, ...], float, dict[str, Any]]] = field(default_factory=OrderedDict)
    _costs_lock: threading.Lock = field(default_factory=threading.Lock)

    def caller_arn(self) -> str:
        if self._caller_arn is None:
            self._caller_arn = (self.caller or (lambda: actions.caller_arn(self.api)))()
        return self._caller_arn

    def job_cost(self, job: dict[str, Any]) -> dict[str, Any]:
        """The job's cost as the API counts it, read again only once the job has moved since."""
        job_id, moved = job["job_id"], job_progress(job)
        with self._costs_lock:
            kept = self._costs.get(job_id)
            if kept is not None and kept[0] == moved and self.clock() - kept[1] < JOB_COST_MAX_AGE_SEC:
                self._costs.move_to_end(job_id)
                return kept[2]
        cost = self.api.job_cost(job_id)  # an ApiError (a held job has no execution yet) is not kept
        with self._costs_lock:
            self._costs[job_id] = (moved, self.clock(), cost)
            self._costs.move_to_end(job_id)
            while len(self._costs) > JOB_COSTS_KEPT:
                self._costs.popitem(last=False)
        return cost


def job_progress(job: dict[str, Any]) -> tuple[Any, ...]:
    """What changes whenever the job's execution takes steps: its status and stage, and each
    stage's status and attempt."""
    return (job["status"], job.get("current_stage"), job.get("waiting_stage"),
            tuple((stage.get("name"), stage.get("status"), stage.get("attempt"), stage.get("retry_count"))
                  for stage in job.get("stages") or []))


templates = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
templates.filters["duration"] = format_duration
templates.filters["thousands"] = lambda n: f"{int(n):,}"
templates.filters["artifact_type"] = artifact_type
templates.filters["human_bytes"] = lambda n: human_bytes(n or 0)
templates.filters["exact"] = exact_time
templates.filters["attempt_words"] = attempt_words
templates.filters["reason_words"] = lambda reason, region=None, detail=None: queue_reason_words(reason, region, detail) if reason else ""
templates.filters["ago"] = lambda iso: time_ago(iso, datetime.now(timezone.utc))
templates.filters["short_ref"] = lambda ref: next((ref[len(p):] for p in ("refs/heads/", "refs/tags/") if (ref or "").startswith(p)), ref or "")


def _page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(templates.get_template(name).render(**context), status_code=status)


def _refusal(exc: ApiError) -> JSONResponse:
    body = exc.body if isinstance(exc.body, dict) else {"message": str(exc.body)}
    return JSONResponse(body, status_code=exc.status)


def _error_page(exc: ApiError) -> HTMLResponse:
    return _page("error.html", status=exc.status, error=exc)


def job_panel_context(console: Console, job: dict[str, Any]) -> dict[str, Any]:
    """The job, its summary's computed fields, and for each button whether it is enabled (None)
    or why not."""
    caller = console.caller_arn()
    level = actions.caller_level(console.api, caller, job["project"])
    buttons = [(action, actions.button_state(action, job, caller, level)) for action in actions.ACTIONS]
    rerun_from = actions.button_state(actions.RERUN_FROM, job, caller, level)
    queued = None
    if job["status"] == "queued":
        queued = next((entry for entry in console.api.queue()["jobs"] if entry["job_id"] == job["job_id"]), None)
    try:
        cost: dict[str, Any] | None = console.job_cost(job)
    except ApiError as exc:  # a held job has no execution yet (409 JOB_NOT_STARTED)
        cost = {"unavailable": str(exc)}
    summary = job_summary(job, queued, datetime.now(timezone.utc))
    return {"job": job, "buttons": buttons, "rerun_from": rerun_from, "caller": caller, "cost": cost,
            "level": level.value if level else "no grant", "summary": summary,
            "directories": archive.artifact_directories(job.get("artifacts") or [])}


def project_levels(console: Console, caller: str) -> Callable[[str], actions.Level | None]:
    """The caller's level on a project, probed once per project a page shows."""
    levels: dict[str, actions.Level | None] = {}

    def level_on(project: str) -> actions.Level | None:
        if project not in levels:
            levels[project] = actions.caller_level(console.api, caller, project)
        return levels[project]

    return level_on


# GET /jobs query parameters the job list's filters map to, one each.
JOB_FILTERS = ("q", "project", "group", "agent", "status", "trigger", "since", "until")


def job_list_context(console: Console, filters: dict[str, str | None]) -> dict[str, Any]:
    """The jobs the API lists for these filters, each with its buttons' states, and the groups
    and projects the filters offer."""
    listed = console.api.list_jobs(**filters)
    projects = console.api.list_projects()["projects"]
    plans = {p["id"]: [stage["name"] for stage in p.get("stages") or []] for p in projects}
    caller = console.caller_arn()
    level_on = project_levels(console, caller)
    now = datetime.now(timezone.utc)
    rows = [{"job": job, "buttons": actions.row_buttons(job, caller, level_on(job["project"]), plans.get(job["project"], [])),
             "duration_sec": seconds_between(job.get("started_at"), job.get("ended_at"), now)}
            for job in listed["jobs"]]
    return {"rows": rows, "truncated": listed["truncated"], "filters": filters,
            "groups": sorted({p["group"] for p in projects if p.get("group")}), "projects": sorted(plans)}


async def job_list(request: Request) -> Response:
    console: Console = request.app.state.console
    filters = {name: request.query_params.get(name) or None for name in JOB_FILTERS}
    try:
        context = await run_in_threadpool(job_list_context, console, filters)
    except ApiError as exc:
        return _error_page(exc)
    return _page("jobs.html", **context)


def _waited_sec(since: str | None, now: datetime) -> int | None:
    if not since:
        return None
    return max(0, int((now - datetime.fromisoformat(since)).total_seconds()))


def queue_context(console: Console, view: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The queue as the API lists it, each job with its wait and its buttons' states."""
    caller = console.caller_arn()
    level_on = project_levels(console, caller)
    rows = []
    for job in view["jobs"]:
        level = level_on(job["project"])
        buttons = [(action, actions.button_state(action, job, caller, level))
                   for action in (actions.BY_NAME["promote"], actions.SET_PRIORITY, actions.BY_NAME["cancel"])]
        rows.append({"job": job, "waited_sec": _waited_sec(job.get("created_at"), now), "buttons": buttons})
    waits = [row["waited_sec"] for row in rows if row["waited_sec"] is not None]
    return {"rows": rows, "oldest_wait_sec": max(waits, default=None), "agents": view["agents"],
            "waiting_for_agent": view.get("waiting_for_agent", []), "truncated": view["truncated"]}


async def queue_page(request: Request) -> Response:
    console: Console = request.app.state.console
    try:
        view = await run_in_threadpool(console.api.queue)
        context = await run_in_threadpool(queue_context, console, view, datetime.now(timezone.utc))
    except ApiError as exc:
        return _error_page(exc)
    return _page("queue.html", **context)


def dlq_context(console: Console) -> dict[str, Any]:
    caller = console.caller_arn()
    listing = console.api.dead_letters()
    levels: dict[str, Any] = {}

    def why_not(action: actions.Action, project: str | None) -> str | None:
        if project not in levels:
            levels[project] = actions.caller_level(console.api, caller, project) if project else None
        return actions.button_state(action, {"project": project or "?"}, caller, levels[project])

    entries = [{"entry": e, "why_not": why_not(actions.REDRIVE, e["project"])} for e in listing["entries"]]
    frozen = [{"key": k, "why_not": why_not(actions.UNFREEZE, k.get("project"))} for k in listing.get("frozen_keys") or []]
    return {"entries": entries, "frozen": frozen}


async def dlq_page(request: Request) -> Response:
    console: Console = request.app.state.console
    try:
        context = await run_in_threadpool(dlq_context, console)
    except ApiError as exc:
        return _error_page(exc)
    return _page("dlq.html", **context)


async def dlq_action(request: Request) -> Response:
    """Redrive (POST /dlq/{job_id}/redrive) or unfreeze (POST /dlq/keys/{key}/unfreeze)."""
    console: Console = request.app.state.console
    params = request.path_params
    try:
        if "key" in params:
            result = await run_in_threadpool(console.api.unfreeze_key, params["key"])
        else:
            result = await run_in_threadpool(console.api.redrive, params["job_id"])
    except ApiError as exc:
        return _refusal(exc)
    return JSONResponse(result)


# The fleet page's pause lengths (a pause ends by itself; the API allows up to 7 days).
FLEET_TIMEOUTS = ((300, "5 minutes"), (1800, "30 minutes"), (7200, "2 hours"), (86400, "1 day"), (7 * 86400, "7 days"))


def fleet_context(view: dict[str, Any], caller: str) -> dict[str, Any]:
    """GET /queue's agents per region affinity of the stack (a region no agent reported from, or
    whose dispatch is paused, is listed too), each region's dispatch pause, and whether the caller
    may pause, drain and resume (`fleet_manage`: the stack's admins; otherwise why not)."""
    agents = view["agents"]
    paused = {pause["region"]: pause for pause in view.get("paused_regions") or []}
    regions = sorted(set(view.get("regions") or ()) | {agent["region"] for agent in agents} | set(paused))
    manage = bool(view.get("fleet_manage"))
    why_not = None if manage else (f"{caller} is not one of the stack's AdminPrincipals: pausing, draining and resuming "
                                   "agents changes where every project's stages run, so only they may")
    return {"regions": [(region, [a for a in agents if a["region"] == region]) for region in regions], "paused_regions": paused,
            "fleet_manage": manage, "why_not": why_not, "timeouts": FLEET_TIMEOUTS}


async def fleet_page(request: Request) -> Response:
    """Agents per region: online or offline, last seen, capacity used, running stages, version;
    and a region's dispatch pause, with its note and until."""
    console: Console = request.app.state.console
    try:
        view = await run_in_threadpool(console.api.queue)
        caller = await run_in_threadpool(console.caller_arn)
    except ApiError as exc:
        return _error_page(exc)
    return _page("fleet.html", **fleet_context(view, caller))


async def fleet_action(request: Request) -> Response:
    """Pause, drain or resume an agent (POST /agents/{id}/pause, /resume), pause or resume a
    region's dispatch (POST /regions/{region}/pause, /resume): the API decides, as for the CLI."""
    console: Console = request.app.state.console
    body = await _json_object(request)
    if isinstance(body, Response):
        return body
    params, action = request.path_params, request.path_params["action"]
    if action not in (("pause", "drain", "resume") if "agent_id" in params else ("pause", "resume")):
        return JSONResponse({"error": "NOT_FOUND", "message": f"no action {action!r}"}, status_code=404)
    pause = {"note": str(body.get("note") or ""), "timeout_sec": body.get("timeout_sec")}
    try:
        if "agent_id" in params:
            if action == "resume":
                result = await run_in_threadpool(console.api.resume_agent, params["agent_id"], body.get("region") or None)
            else:
                request_body = {**pause, "drain": action == "drain", **({"region": body["region"]} if body.get("region") else {})}
                result = await run_in_threadpool(console.api.pause_agent, params["agent_id"], request_body)
        elif action == "resume":
            result = await run_in_threadpool(console.api.resume_region, params["region"])
        else:
            result = await run_in_threadpool(console.api.pause_region, params["region"], pause)
    except ApiError as exc:
        return _refusal(exc)
    return JSONResponse(result)


def run_context(console: Console, selected: str | None, group: str | None = None) -> dict[str, Any]:
    """The projects the caller may run (`operate`), those of `group` when one is chosen, and the
    selected one: the first left when the filter leaves the asked-for project out."""
    caller = console.caller_arn()
    runnable = []
    for project in sorted(console.api.list_projects()["projects"], key=lambda p: p["id"]):
        level = actions.caller_level(console.api, caller, project["id"])
        if level is not None and level.covers(actions.Level.OPERATE):
            runnable.append(project)
    groups = sorted({p["group"] for p in runnable if p.get("group")})
    shown = [p for p in runnable if p.get("group") == group] if group else runnable
    chosen = next((p for p in shown if p["id"] == selected), shown[0] if shown else None)
    return {"projects": shown, "project": chosen, "groups": groups, "group": group, "runnable": bool(runnable)}


async def run_page(request: Request) -> Response:
    console: Console = request.app.state.console
    query = request.query_params
    try:
        context = await run_in_threadpool(run_context, console, query.get("project"), query.get("group") or None)
    except ApiError as exc:
        return _error_page(exc)
    return _page("run.html", **context)


async def project_refs(request: Request) -> Response:
    console: Console = request.app.state.console
    try:
        project = await run_in_threadpool(console.api.get_project, request.path_params["project_id"])
    except ApiError as exc:
        return _refusal(exc)
    return JSONResponse(await run_in_threadpool(refs.list_refs, refs.remote_url(project, console.git_base_url)))


def start_run(api: RelevoApi, project_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST /projects/{id}/run as `relevo project run --again` sends it, then where the job stands: its
    queue position while it is queued."""
    request = {"trigger": "manual", "request_id": secrets.token_hex(8),
               **{k: body[k] for k in ("ref", "stages", "priority") if body.get(k) not in (None, "", [])}}
    result = api.run_project(project_id, request)
    if result.get("outcome", "queued") == "queued" and not result.get("duplicate"):
        queued = next((job for job in api.queue()["jobs"] if job["job_id"] == result["job_id"]), None)
        result["queue_position"] = queued["queue_position"] if queued else None
    return result


async def run_submit(request: Request) -> Response:
    console: Console = request.app.state.console
    body = await _json_object(request)
    if isinstance(body, Response):
        return body
    try:
        result = await run_in_threadpool(start_run, console.api, request.path_params["project_id"], body)
    except ApiError as exc:
        return _refusal(exc)
    return JSONResponse(result)


async def _json_object(request: Request) -> dict[str, Any] | Response:
    """The body as a JSON object (whatever its Content-Type says), or the 400 that refuses it."""
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return JSONResponse({"error": "VALIDATION_FAILED", "message": "(root): the body is not JSON"}, status_code=400)
    if not isinstance(body, dict):
        return JSONResponse({"error": "VALIDATION_FAILED", "message": "(root): the body is a JSON object"}, status_code=400)
    return body


async def job_detail(request: Request) -> Response:
    console: Console = request.app.state.console
    job_id = request.path_params["job_id"]
    try:
        job = await run_in_threadpool(console.api.get_job, job_id)
        context = await run_in_threadpool(job_panel_context, console, job)
    except ApiError as exc:
        return _error_page(exc)
    start = request.query_params.get("from_seq")
    if start is not None and start.isdigit():
        # The log from this seq on (`?from_seq=0`: the whole log, streamed) instead of its tail.
        tail = {"chunks": [], "next_seq": int(start), "before_seq": int(start) or None}
    else:
        end = (job.get("log_tail") or {}).get("next_seq", 0)
        try:
            tail = await run_in_threadpool(last_chunks, console.api, job_id, end)
        except ApiError as exc:
            return _error_page(exc)
    return _page("job.html", tail=tail, tail_json=json.dumps(tail), log_max_lines=LOG_MAX_LINES, **context)


def last_chunks(api: RelevoApi, job_id: str, end: int, lines: int = LOG_TAIL_LINES) -> dict[str, Any]:
    """Whole chunks before seq `end`, read back a page at a time until they hold `lines` lines:
    the log's end as the page first shows it. Whole chunks (not the job view's line tail) so that
    "Load earlier" (before_seq = the first chunk's seq) joins them with no gap and no overlap."""
    def count(held: list[dict[str, Any]]) -> int:
        return sum(chunk["text"].count("\n") for chunk in held)

    chunks: list[dict[str, Any]] = []
    before: int | None = end if end > 0 else None
    while before is not None and count(chunks) < lines:
        page = api.job_logs(job_id, before_seq=before, limit=TAIL_PAGE_CHUNKS)
        chunks[:0] = page["chunks"]
        before = page["before_seq"]
    # A page holds whole chunks: keep only those needed for `lines`.
    while len(chunks) > 1 and count(chunks[1:]) >= lines:
        chunks.pop(0)
    # Seqs are contiguous from 0: a first chunk after 0 means earlier output to load.
    first = chunks[0]["seq"] if chunks else 0
    return {"chunks": chunks, "next_seq": chunks[-1]["seq"] + 1 if chunks else end, "before_seq": first or None}


async def job_panel(request: Request) -> Response:
    """The job's summary, stages and actions (above the log) and its steps, handoff and artifacts
    (below it), each part for its section: the page swaps them in on a state event."""
    console: Console = request.app.state.console
    try:
        job = await run_in_threadpool(console.api.get_job, request.path_params["job_id"])
        context = await run_in_threadpool(job_panel_context, console, job)
    except ApiError as exc:
        return _error_page(exc)
    return _page("job_parts.html", **context)


async def job_stream(request: Request) -> Response:
    console: Console = request.app.state.console
    job_id = request.path_params["job_id"]
    try:
        from_seq = int(request.query_params.get("from_seq", "0"))
    except ValueError:
        return JSONResponse({"error": "VALIDATION_FAILED", "message": "from_seq: not an integer"}, status_code=400)
    if from_seq < 0:
        return JSONResponse({"error": "VALIDATION_FAILED", "message": "from_seq: must be >= 0"}, status_code=400)
    events = job_events(
        lambda seq: console.api.job_logs(job_id, from_seq=seq, limit=LOG_MAX_LIMIT),
        lambda: console.api.get_job(job_id),
        from_seq,
        console.settings,
        sleep=anyio.sleep,
    )
    return EventSourceResponse(events, ping=console.settings.ping_sec)


async def job_logs_before(request: Request) -> Response:
    """"Load earlier": one page back from before_seq (the API's own paging)."""
    console: Console = request.app.state.console
    try:
        before_seq = int(request.query_params["before_seq"])
    except (KeyError, ValueError):
        return JSONResponse({"error": "VALIDATION_FAILED", "message": "before_seq: an integer is required"}, status_code=400)
    try:
        page = await run_in_threadpool(console.api.job_logs, request.path_params["job_id"], None, before_seq, LOG_TAIL_LINES)
    except ApiError as exc:
        return _refusal(exc)
    return JSONResponse(page)


async def job_action(request: Request) -> Response:
    console: Console = request.app.state.console
    name = request.path_params["action"]
    if name not in actions.BY_NAME:
        return JSONResponse({"error": "NOT_FOUND", "message": f"no action {name!r}"}, status_code=404)
    body = await _json_object(request)
    if isinstance(body, Response):
        return body
    try:
        result = await run_in_threadpool(actions.api_call, console.api, name, request.path_params["job_id"], body)
    except ApiError as exc:
        return _refusal(exc)
    return JSONResponse(result if isinstance(result, dict) else {"result": result})


async def artifact_download(request: Request) -> Response:
    """A 2-minute presigned link from the API, followed by the browser (a native download)."""
    console: Console = request.app.state.console
    try:
        link = await run_in_threadpool(
            console.api.artifact_link, request.path_params["job_id"], request.path_params["name"], request.query_params.get("stage")
        )
    except ApiError as exc:
        return _error_page(exc)
    return RedirectResponse(link["url"], status_code=303)


async def artifact_directory_download(request: Request) -> Response:
    """A directory artifact as one .tar.gz, whole before it is sent (relevo_cli.console.archive)."""
    console: Console = request.app.state.console
    job_id, directory = request.path_params["job_id"], request.path_params["name"]
    stage = request.query_params.get("stage") or ""
    workdir = Path(tempfile.mkdtemp(prefix="relevo-console-"))
    try:
        job = await run_in_threadpool(console.api.get_job, job_id)
        path = await run_in_threadpool(archive.directory_tarball, console.api, job, stage, directory, workdir)
    except ApiError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return _error_page(exc)
    except archive.NoSuchDirectory as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return JSONResponse({"error": "ARTIFACT_NOT_FOUND", "message": str(exc)}, status_code=404)
    except ChecksumMismatch as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return JSONResponse({"error": "CHECKSUM_MISMATCH", "message": str(exc)}, status_code=502)
    return FileResponse(path, media_type="application/gzip", filename=path.name,
                        background=BackgroundTask(shutil.rmtree, workdir, ignore_errors=True))


def create_app(console: Console, console_secrets: ConsoleSecrets, port: int, announce: Callable[[str], None] | None = None) -> ASGIApp:
    """The console's routes behind its guard; `announce` gets a new sign-in link when a spent one
    is opened by a browser without the session (relevo_cli.console.security)."""
    app = Starlette(
        routes=[
            Route("/", job_list),
            Route("/queue", queue_page),
            Route("/run", run_page),
            Route("/dlq", dlq_page),
            Route("/dlq/keys/{key:path}/unfreeze", dlq_action, methods=["POST"]),
            Route("/dlq/{job_id}/redrive", dlq_action, methods=["POST"]),
            Route("/fleet", fleet_page),
            Route("/agents/{agent_id}/{action:str}", fleet_action, methods=["POST"]),
            Route("/regions/{region}/{action:str}", fleet_action, methods=["POST"]),
            Route("/deliveries", deliveries_page),
            Route("/projects/{project_id}/refs", project_refs),
            Route("/projects/{project_id}/run", run_submit, methods=["POST"]),
            Route("/jobs/{job_id}", job_detail),
            Route("/jobs/{job_id}/panel", job_panel),
            Route("/jobs/{job_id}/stream", job_stream),
            Route("/jobs/{job_id}/logs", job_logs_before),
            Route("/jobs/{job_id}/actions/{action}", job_action, methods=["POST"]),
            Route("/jobs/{job_id}/artifacts/{name:path}", artifact_download),
            Route("/jobs/{job_id}/directories/{name}.tar.gz", artifact_directory_download),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
    )
    app.state.console = console
    return guarded(app, console_secrets, port, announce)
