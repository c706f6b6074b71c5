"""What the job page's summary and steps show beyond the job view's own fields: when the job
started, how long it ran, its place in the queue, and per stage its duration and the bytes its
artifacts hold.

Transfer progress: the agent reports an upload's progress only as log lines (`[relevo] uploading
…`, relevo_agent.artifacts.Progress), and records nothing while it transfers; what the API keeps is
one artifact record per file uploaded. So a stage's transfer is shown as the files and bytes of its
artifact records, once uploaded.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any


def _at(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def seconds_between(start: str | None, end: str | None, now: datetime) -> int | None:
    """Whole seconds from `start` to `end` (to `now` while there is no end); None before a start."""
    began = _at(start)
    if began is None:
        return None
    return max(0, int(((_at(end) or now) - began).total_seconds()))


def job_started_at(job: dict[str, Any]) -> str | None:
    """When the job's first stage started (the job view has no start of its own)."""
    starts = [stage["started_at"] for stage in job["stages"] if stage.get("started_at")]
    return min(starts, key=datetime.fromisoformat) if starts else None


def stage_transfers(artifacts: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Per stage: (files, bytes) of the artifacts it uploaded."""
    totals: dict[str, tuple[int, int]] = {}
    for artifact in artifacts:
        files, size = totals.get(artifact["stage"], (0, 0))
        totals[artifact["stage"]] = (files + 1, size + int(artifact["size"]))
    return totals


def job_summary(job: dict[str, Any], queued: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
    """The summary's computed fields; `queued` is the job's entry in GET /queue, while it is queued."""
    started = job_started_at(job)
    return {
        "started_at": started,
        "duration_sec": seconds_between(started, job.get("ended_at"), now),
        "queue_position": queued["queue_position"] if queued else None,
        "stage_sec": {stage["name"]: seconds_between(stage.get("started_at"), stage.get("ended_at"), now) for stage in job["stages"]},
        "transfers": stage_transfers(job.get("artifacts") or []),
    }


def format_duration(seconds: int | None) -> str:
    """`42s`, `3m 5s`, `2h 7m`; `—` for none."""
    if seconds is None:
        return "—"
    if seconds >= 3600:
        return f"{seconds // 3600}h {(seconds % 3600) // 60}m"
    if seconds >= 60:
        return f"{seconds // 60}m {seconds % 60}s"
    return f"{seconds}s"
