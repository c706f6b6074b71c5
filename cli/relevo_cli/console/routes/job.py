"""GET /jobs/{id}: the job page, its panel, its live stream and earlier log, its buttons and its
artifacts' downloads."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from relevo_cli.api import ApiError
from relevo_cli.artifacts import ChecksumMismatch
from relevo_cli.console import actions, archive
from relevo_cli.console.render import (
    api_answer,
    error_page,
    invalid,
    json_object,
    no_such_action,
    page,
    refusal,
)
from relevo_cli.console.state import Console
from relevo_cli.console.stream import job_events
from relevo_cli.console.views.job import (
    LOG_MAX_LINES,
    LOG_TAIL_LINES,
    empty_log_note,
    job_panel_context,
    shard_labels,
    tail_for_page,
)
from relevo_core.models.requests import LOG_CURSOR, LOG_MAX_LIMIT


async def job_detail(request: Request) -> Response:
    console: Console = request.app.state.console
    job_id = request.path_params["job_id"]
    try:
        job = await run_in_threadpool(console.api.get_job, job_id)
        context = await run_in_threadpool(job_panel_context, console, job)
    except ApiError as exc:
        return error_page(exc)
    start = request.query_params.get("from_seq")
    if start is not None and re.fullmatch(LOG_CURSOR, start):
        # The log from this cursor on (`?from_seq=0`: the whole log, streamed) instead of its tail.
        cursor: int | str = int(start) if start.isdigit() else start
        tail: dict[str, Any] = {
            "chunks": [],
            "next_seq": cursor,
            "before_seq": None if start == "0" else cursor,
            "marks": [],
        }
    else:
        try:
            tail = await run_in_threadpool(tail_for_page, console.api, job)
        except ApiError as exc:
            return error_page(exc)
    return page(
        "job.html",
        tail=tail,
        tail_json=json.dumps(tail),
        shard_labels_json=json.dumps(shard_labels(job)),
        log_max_lines=LOG_MAX_LINES,
        log_empty=empty_log_note(job),
        **context,
    )


async def job_panel(request: Request) -> Response:
    """The job's summary, stages and actions (above the log) and its steps, handoff and artifacts
    (below it), each part for its section: the page swaps them in on a state event."""
    console: Console = request.app.state.console
    try:
        job = await run_in_threadpool(console.api.get_job, request.path_params["job_id"])
        context = await run_in_threadpool(job_panel_context, console, job)
    except ApiError as exc:
        return error_page(exc)
    return page("job_parts.html", **context)


async def job_stream(request: Request) -> Response:
    console: Console = request.app.state.console
    job_id = request.path_params["job_id"]
    from_seq = request.query_params.get("from_seq", "0")
    if not re.fullmatch(LOG_CURSOR, from_seq):
        return invalid("from_seq: not a log cursor (a page's next_seq)")
    events = job_events(
        lambda seq: console.api.job_logs(job_id, from_seq=seq, limit=LOG_MAX_LIMIT),
        lambda: console.api.get_job(job_id),
        from_seq,
        console.settings,
        sleep=anyio.sleep,
    )
    return EventSourceResponse(events, ping=console.settings.ping_sec)


async def job_logs_before(request: Request) -> Response:
    """ "Load earlier": one page back from before_seq (the API's own paging)."""
    console: Console = request.app.state.console
    before_seq = request.query_params.get("before_seq", "")
    if not re.fullmatch(LOG_CURSOR, before_seq):
        return invalid("before_seq: a log cursor is required (a page's before_seq)")
    return await api_answer(
        console.api.job_logs, request.path_params["job_id"], None, before_seq, LOG_TAIL_LINES
    )


async def job_action(request: Request) -> Response:
    console: Console = request.app.state.console
    name = request.path_params["action"]
    if name not in actions.BY_NAME:
        return no_such_action(name)
    body = await json_object(request)
    if isinstance(body, Response):
        return body
    try:
        result = await run_in_threadpool(
            actions.api_call, console.api, name, request.path_params["job_id"], body
        )
    except ApiError as exc:
        return refusal(exc)
    return JSONResponse(result if isinstance(result, dict) else {"result": result})


def _shard(request: Request) -> int | None:
    """`?shard=K` of a download link: the shard of a stage with shards whose file it is (the API
    refuses anything but an index)."""
    shard = request.query_params.get("shard")
    return int(shard) if shard is not None and shard.isdigit() else None


async def artifact_download(request: Request) -> Response:
    """A 2-minute presigned link from the API, followed by the browser (a native download)."""
    console: Console = request.app.state.console
    try:
        link = await run_in_threadpool(
            console.api.artifact_link,
            request.path_params["job_id"],
            request.path_params["name"],
            request.query_params.get("stage"),
            _shard(request),
        )
    except ApiError as exc:
        return error_page(exc)
    return RedirectResponse(link["url"], status_code=303)


async def artifact_directory_download(request: Request) -> Response:
    """A directory artifact as one .tar.gz, whole before it is sent (relevo_cli.console.archive)."""
    console: Console = request.app.state.console
    job_id, directory = request.path_params["job_id"], request.path_params["name"]
    stage = request.query_params.get("stage") or ""
    workdir = Path(tempfile.mkdtemp(prefix="relevo-console-"))
    try:
        job = await run_in_threadpool(console.api.get_job, job_id)
        path = await run_in_threadpool(
            archive.directory_tarball, console.api, job, stage, directory, workdir, _shard(request)
        )
    except ApiError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return error_page(exc)
    except archive.NoSuchDirectory as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return JSONResponse({"error": "ARTIFACT_NOT_FOUND", "message": str(exc)}, status_code=404)
    except ChecksumMismatch as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return JSONResponse({"error": "CHECKSUM_MISMATCH", "message": str(exc)}, status_code=502)
    return FileResponse(
        path,
        media_type="application/gzip",
        filename=path.name,
        background=BackgroundTask(shutil.rmtree, workdir, ignore_errors=True),
    )


ROUTES = [
    Route("/jobs/{job_id}", job_detail),
    Route("/jobs/{job_id}/panel", job_panel),
    Route("/jobs/{job_id}/stream", job_stream),
    Route("/jobs/{job_id}/logs", job_logs_before),
    Route("/jobs/{job_id}/actions/{action}", job_action, methods=["POST"]),
    Route("/jobs/{job_id}/artifacts/{name:path}", artifact_download),
    Route("/jobs/{job_id}/directories/{name}.tar.gz", artifact_directory_download),
]
