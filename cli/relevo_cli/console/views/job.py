"""The job page (GET /jobs/{id}): its panel (summary, stages, buttons, cost, artifacts) and the
log's end as the page first shows it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.console import actions, archive
from relevo_cli.console.state import Console
from relevo_cli.console.summary import job_summary

LOG_TAIL_LINES = 200
# The job page keeps the newest this many log lines (static/job.js reads it from the page).
LOG_MAX_LINES = 5000
# Chunks per page when the page's first view is read back from the end of the log.
TAIL_PAGE_CHUNKS = 20


def job_panel_context(console: Console, job: dict[str, Any]) -> dict[str, Any]:
    """The job, its summary's computed fields, and for each button whether it is enabled (None)
    or why not."""
    caller = console.caller_arn()
    level = actions.caller_level(console.api, caller, job["project"])
    buttons = [(action, actions.button_state(action, job, caller, level)) for action in actions.ACTIONS]
    rerun_from = actions.button_state(actions.RERUN_FROM, job, caller, level)
    queued = None
    if job["status"] == "queued":
        queued = next(
            (entry for entry in console.api.queue()["jobs"] if entry["job_id"] == job["job_id"]), None
        )
    try:
        cost: dict[str, Any] | None = console.job_cost(job)
    except ApiError as exc:  # a held job has no execution yet (409 JOB_NOT_STARTED)
        cost = {"unavailable": str(exc)}
    summary = job_summary(job, queued, datetime.now(UTC))
    return {
        "job": job,
        "buttons": buttons,
        "rerun_from": rerun_from,
        "caller": caller,
        "cost": cost,
        "level": level.value if level else "no grant",
        "summary": summary,
        "directories": archive.artifact_directories(job.get("artifacts") or []),
    }


def empty_log_note(job: dict[str, Any]) -> str:
    """What the log box says while the job has printed nothing: why, in a few words."""
    if job.get("waiting_stage"):
        return f"No output yet: the job waits for approval before {job['waiting_stage']}."
    if job["status"] == "queued":
        return "No output yet: the job is queued (its place and why it waits are above)."
    if job["status"] == "held":
        return "No output yet: the job is held until it is released."
    if job["status"] in ("succeeded", "failed", "canceled"):
        return f"No output: the job {job['status']} without printing anything."
    return "No output yet: a stage's lines appear here as it prints them."


def shard_labels(job: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each stage with shards: its shards' labels by index (static/job.js names a chunk's shard so)."""
    return {
        stage["name"]: {str(shard["shard"]): shard["label"] for shard in stage["shards"]}
        for stage in job["stages"]
        if stage.get("shards")
    }


def last_chunks(api: RelevoApi, job_id: str, end: int | str, lines: int = LOG_TAIL_LINES) -> dict[str, Any]:
    """Whole chunks before the cursor `end`, read back a page at a time until they hold `lines`
    lines: the log's end as the page first shows it. Whole chunks (not the job view's line tail) so
    that "Load earlier" (before_seq = the cursor before the first chunk) joins them with no gap and
    no overlap."""

    def count(held: list[dict[str, Any]]) -> int:
        return sum(chunk["text"].count("\n") for chunk in held)

    chunks: list[dict[str, Any]] = []
    before: int | str | None = end if str(end) != "0" else None
    start = before
    while before is not None and count(chunks) < lines:
        page = api.job_logs(job_id, before_seq=before, limit=TAIL_PAGE_CHUNKS)
        chunks[:0] = page["chunks"]
        before = start = page["before_seq"]
    # A page holds whole chunks: keep only those needed for `lines`; the cursor before the first
    # kept is the one after the chunk dropped last.
    while len(chunks) > 1 and count(chunks[1:]) >= lines:
        start = chunks.pop(0)["next"]
    return {"chunks": chunks, "next_seq": chunks[-1]["next"] if chunks else end, "before_seq": start}


def tail_for_page(api: RelevoApi, job: dict[str, Any]) -> dict[str, Any]:
    """The log's end as the job page first shows it (last_chunks), with the banners where each
    stage attempt in it ended (`marks` on a chunk: before its text; the tail's `marks`: after it)."""
    from relevo_cli.console.banners import tail_with_banners

    tail = last_chunks(api, job["job_id"], (job.get("log_tail") or {}).get("next_seq", 0))
    tail["chunks"], tail["marks"] = tail_with_banners(tail["chunks"], job)
    return tail
