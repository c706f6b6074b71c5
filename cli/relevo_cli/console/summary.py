"""What the job page's summary and steps show beyond the job view's own fields: when the job
started, how long it ran, its place in the queue, its failure as a sentence, which Mac ran which
stages and why it waits, and per stage its duration and its transfer.

Transfer: the agent writes each attempt's upload progress on its stage record while it uploads
(relevo_agent.transfer; the job view's `transfer` per stage, `transfers` for every attempt), so a
stage's cell says "uploading 3 of 5 files, 412.0 MiB of 1.2 GiB (34 %)" and then its totals. A stage
with artifact records and no transfer reading (uploaded by an agent from before readings) shows the
files and bytes of its records.
"""

from __future__ import annotations

import mimetypes
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

# seconds_between and format_duration: the CLI's too (relevo job view), imported from here by the console.
from relevo_cli.job_view import cache_line
from relevo_cli.words import error_sentence, macs_by_stage, seconds_between, shard_name
from relevo_cli.words import format_duration as format_duration
from relevo_core.models.status import queue_reason_words
from relevo_core.models.transfer import TransferProgress, uploaded_text


def job_started_at(job: dict[str, Any]) -> str | None:
    """When the job's first stage started (the job view has no start of its own)."""
    starts = [stage["started_at"] for stage in job["stages"] if stage.get("started_at")]
    return min(starts, key=datetime.fromisoformat) if starts else None


def stage_transfers(job: dict[str, Any]) -> dict[str, str]:
    """Per stage: what its shown attempt's transfer says, else what its artifact records add up to."""
    totals: dict[str, tuple[int, int]] = {}
    for artifact in job.get("artifacts") or []:
        files, size = totals.get(artifact["stage"], (0, 0))
        totals[artifact["stage"]] = (files + 1, size + int(artifact["size"]))
    texts = {name: uploaded_text(files, size) for name, (files, size) in totals.items()}
    for stage in job["stages"]:
        if stage.get("transfer"):
            texts[stage["name"]] = TransferProgress.model_validate(stage["transfer"]).describe()
    return texts


def attempt_transfers(stage: dict[str, Any]) -> dict[int, str]:
    """Per attempt of a stage: what its transfer says (the Steps' attempt rows)."""
    return {
        transfer.attempt: transfer.describe()
        for transfer in map(TransferProgress.model_validate, stage.get("transfers") or [])
    }


_DONE = ("succeeded", "warning", "skipped")


def run_progress(job: dict[str, Any]) -> tuple[int, int]:
    """(runs done, runs): a stage runs once, a stage with shards once a shard (as the listing counts)."""
    runs = [run for stage in job["stages"] for run in (stage.get("shards") or [stage])]
    return sum(1 for run in runs if run["status"] in _DONE), len(runs)


def handoff_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The Handoff table's rows: each stage that handed files on, restored some or wrote values;
    for a stage with shards, each such shard (`test[1]`, `ui[device=iPhone 16, os=18.2]`: each
    shard's files and values are its own, and later stages get them all), after its stage's own
    row when the stage has one."""
    rows = []
    for stage in job["stages"]:
        runs = [(stage["name"], stage)] + [
            (f"{stage['name']}[{shard['label']}]", shard) for shard in stage.get("shards") or []
        ]
        for name, run in runs:
            if run.get("handoff") or run.get("outputs"):
                rows.append(
                    {
                        "name": name,
                        "stage": stage["name"],
                        "shard": run.get("shard") if run is not stage else None,
                        "handoff": run.get("handoff") or {},
                        "outputs": run.get("outputs") or {},
                    }
                )
    return rows


def cache_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The Caches lines: each cache of each stage (and of each shard of a stage with shards), in
    `relevo job view`'s own words (relevo_cli.job_view.cache_line): hit, partial hit or miss, the
    key restored, bytes, bytes downloaded, seconds, and what the save did."""
    rows = []
    for stage in job["stages"]:
        runs = [(stage["name"], stage, None)] + [
            (shard_name(stage["name"], shard), shard, shard.get("shard"))
            for shard in stage.get("shards") or []
        ]
        rows += [
            {
                "stage": stage["name"],
                "shard": shard,
                "name": outcome["name"],
                "restore": outcome["restore"],
                "line": cache_line(where, outcome),
            }
            for where, run, shard in runs
            for outcome in run.get("caches") or []
        ]
    return rows


def job_summary(job: dict[str, Any], queued: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
    """The summary's computed fields; `queued` is the job's entry in GET /queue, while it is queued."""
    started = job_started_at(job)
    return {
        "started_at": started,
        "duration_sec": seconds_between(started, job.get("ended_at"), now),
        "queue_position": queued["queue_position"] if queued else None,
        "runs": run_progress(job),
        "stage_sec": {
            stage["name"]: seconds_between(stage.get("started_at"), stage.get("ended_at"), now)
            for stage in job["stages"]
        },
        # A stage with shards: each shard's, by stage then shard index (its own attempt's times).
        "shard_sec": {
            stage["name"]: {
                shard["shard"]: seconds_between(shard.get("started_at"), shard.get("ended_at"), now)
                for shard in stage.get("shards") or []
            }
            for stage in job["stages"]
        },
        "transfers": stage_transfers(job),
        # What travelled: a row per stage, and per shard of a stage with shards.
        "handoff_rows": handoff_rows(job),
        "cache_rows": cache_rows(job),
        "attempt_transfers": {stage["name"]: attempt_transfers(stage) for stage in job["stages"]},
        # The failure as a sentence (the job view has its class and a JSON cause), which Mac ran
        # which stages, and why it waits, in words.
        "error": error_sentence(job),
        "macs": macs_by_stage(job),
        "waiting": queue_reason_words(
            job["queue_reason"], job.get("region_affinity"), job.get("queue_detail")
        )
        if job.get("queue_reason")
        else None,
    }


# The standard library's own table of extensions only (no /etc/mime.types): the same on every machine.
_CONTENT_TYPES = mimetypes.MimeTypes()


def artifact_type(name: str) -> str:
    """What an artifact file is, from its name alone (an artifact record holds no content type):
    "file, " and the content type its extension stands for, else its extension, else "file"."""
    content_type, encoding = _CONTENT_TYPES.guess_type(name)
    if content_type:
        return f"file, {content_type}" + (f" ({encoding})" if encoding else "")
    suffix = PurePosixPath(name).suffix
    return f"file, {suffix}" if suffix else "file"
