"""`GET /jobs/{id}/stream?from_seq=N`: a job's output and state as Server-Sent Events (issue 18,
point 5), polled from the Relevo API the way `relevo job logs -f` polls it (relevo_cli.follow):

- `event: log`, `id: <next seq>`: `{"chunks": [...], "next_seq": N}`, at most `batch_lines` lines a
  batch (a chunk is never split; one chunk longer than that is sent alone);
- `event: state`: `{"status", "current_stage", "waiting_stage"}` whenever one of them changes
  (the first event of every stream is one);
- `event: progress`: `{"transfers": {stage: text}}` whenever what a stage's transfer says changes
  (an upload under way: "uploading 3 of 5 files, 412.0 MiB of 1.2 GiB (34 %)", then its totals),
  read with the job, so the Steps' cells follow an upload without a reload;
- each chunk carries `marks`: the banners to show before its text where a stage attempt (or a
  shard, or a stage with shards) ended (`{"id", "text"}`: `build succeeded on mac-1 after 8s`,
  relevo_cli.console.banners), and `event: marks` `{"marks": [...]}` the ends a read that reached
  the end of the stored log says; a chunk whose stage's predecessor the page does not yet say
  ended is read again (the CLI follower's rule), so a banner never comes after a later stage's lines;
- `event: done`: the job ended and every chunk written before it ended was sent;
- `event: refused`: the API refused the read (not transient): `{"status", "error", "message"}`;
- `: ping` comments from sse-starlette every `ping_sec`, so an idle connection stays open.

The log pages are read from the seq after the last chunk sent, so a client that reconnects with
`from_seq` = the `id` of the last event it saw gets no gap and no repeat. A stream ends itself
after `lifetime_sec`: the page reconnects from where it was, as after any dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from relevo_cli.api import ApiError
from relevo_cli.console.banners import HOLD_PAGES, Banners
from relevo_cli.console.summary import stage_transfers
from relevo_cli.follow import is_transient


class StreamSettings(BaseModel):
    """The stream's intervals (the issue's numbers by default; tests shorten them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    poll_sec: float = Field(0.5, gt=0, description="how often the log is read while nothing new is stored")
    state_sec: float = Field(2.0, gt=0, description="how often the job itself is read for stage changes")
    job_read_wait_sec: float = Field(
        0.0,
        ge=0,
        description="how long a poll waits for the periodic job read under way before it goes on without it",
    )
    ping_sec: float = Field(15.0, gt=0, description="the keep-alive comment's interval")
    lifetime_sec: float = Field(
        600.0, gt=0, description="a stream ends itself after this long (the page reconnects)"
    )
    batch_lines: int = Field(500, ge=1, description="at most this many lines in one `log` event")
    retry_backoff_sec: float = Field(1.0, gt=0, description="wait after a transient API failure")


def batches(chunks: list[dict[str, Any]], max_lines: int) -> list[list[dict[str, Any]]]:
    """Consecutive chunks grouped so that no group holds more than max_lines lines (a chunk's
    lines are its newlines, plus one for an unterminated tail), unless one chunk alone does."""
    groups: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    lines = 0
    for chunk in chunks:
        text = chunk["text"]
        count = text.count("\n") + (0 if text.endswith("\n") else 1)
        if current and lines + count > max_lines:
            groups.append(current)
            current, lines = [], 0
        current.append(chunk)
        lines += count
    if current:
        groups.append(current)
    return groups


def _job_state(job: dict[str, Any], page: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The state event's body (status and gate from the log page, the current stage from the job)
    and the progress event's transfers (from the job)."""
    state = {
        "status": page["status"],
        "waiting_stage": page["waiting_stage"],
        "current_stage": job["current_stage"],
    }
    return state, stage_transfers(job) if "stages" in job else {}


def _forget(read: asyncio.Future[Any] | None) -> None:
    """Let a job read finish unheard: its outcome (an error included) is consumed when it ends."""
    if read is not None:
        read.add_done_callback(lambda done: done.cancelled() or done.exception())


def _event(name: str, data: dict[str, Any], event_id: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"event": name, "data": json.dumps(data)}
    if event_id is not None:
        event["id"] = str(event_id)
    return event


async def job_events(
    read_logs: Callable[[int | str], dict[str, Any]],
    read_job: Callable[[], dict[str, Any]],
    from_seq: int | str,
    settings: StreamSettings,
    sleep: Callable[[float], Awaitable[None]],
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[dict[str, Any]]:
    """The events of one stream; `read_logs(from_seq)` is one GET …/logs page, `read_job()` one
    GET /jobs/{id} (both blocking: run in the thread pool)."""
    next_seq = from_seq
    started = clock()
    last_state: dict[str, Any] | None = None
    last_transfers: dict[str, str] = {}
    transfers: dict[str, str] = {}
    state_read_at: float | None = None
    # The job's periodic read (current stage, transfers) runs beside the polls, and no poll waits
    # for it: a poll takes its answer once it is in. Awaited in the poll that started it, a slow
    # job read held back that poll's lines, and the next poll's, every state_sec.
    job_read: asyncio.Future[dict[str, Any]] | None = None
    banners = Banners()
    holds = 0
    try:
        while clock() - started < settings.lifetime_sec:
            polled_at = clock()
            # The stream's first read of the job runs beside its first log read: the first event
            # (the job's state) needs both, and lines printed meanwhile wait for the next poll.
            if job_read is None and (state_read_at is None or clock() - state_read_at >= settings.state_sec):
                job_read = asyncio.ensure_future(run_in_threadpool(read_job))
            try:
                page = await run_in_threadpool(read_logs, next_seq)
                if last_state is None:
                    # The first event of every stream is the job's state.
                    read, job_read = job_read, None
                    assert read is not None
                    last_state, transfers = _job_state(await read, page)
                    state_read_at = clock()
                    yield _event("state", last_state)
                # New lines go out before the job is read again: a line is never late for a state read.
                # A page starts at the cursor asked for; each chunk's `next` is the cursor after it.
                chunks, held = banners.place(page, held="end" if holds >= HOLD_PAGES else "wait")
                for group in batches(chunks, settings.batch_lines):
                    next_seq = group[-1]["next"]
                    yield _event("log", {"chunks": group, "next_seq": next_seq}, event_id=next_seq)
                if held:
                    # Read again from the chunk held back: at once the first time, then each poll.
                    holds += 1
                    if holds > 1:
                        await sleep(settings.poll_sec)
                    continue
                holds = 0
                state = {
                    "status": page["status"],
                    "waiting_stage": page["waiting_stage"],
                    "current_stage": last_state["current_stage"],
                }
                if state["status"] != last_state["status"]:
                    # The job moved: read it now. A periodic read under way began before the move.
                    _forget(job_read)
                    job_read = None
                    state, transfers = _job_state(await run_in_threadpool(read_job), page)
                    state_read_at = clock()
                elif (
                    job_read is not None
                    and (await asyncio.wait({job_read}, timeout=settings.job_read_wait_sec))[0]
                ):
                    read, job_read = job_read, None
                    state, transfers = _job_state(read.result(), page)
                    state_read_at = clock()
            except ApiError as exc:
                if is_transient(exc):
                    await sleep(settings.retry_backoff_sec)
                    continue
                yield _event("refused", {"status": exc.status, "error": exc.code, "message": str(exc)})
                return
            except Exception as exc:  # the network: wait it out, as the CLI follower does
                if not is_transient(exc):
                    raise
                await sleep(settings.retry_backoff_sec)
                continue
            if state != last_state:
                yield _event("state", state)
                last_state = state
            if transfers != last_transfers:
                yield _event("progress", {"transfers": transfers})
                last_transfers = transfers
            if page["more"]:
                continue
            ends = banners.ends(page, final=page["terminal"])
            if ends:
                yield _event("marks", {"marks": ends})
            if page["terminal"]:
                yield _event("done", {"status": page["status"], "next_seq": next_seq})
                return
            # Polls keep a steady cadence: the reads' own time counts toward the interval.
            await sleep(max(0.0, settings.poll_sec - (clock() - polled_at)))
    finally:
        _forget(job_read)  # a stream that ends (or is closed) with a job read under way
