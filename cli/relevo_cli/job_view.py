"""How `relevo job view` shows a job: a table of its stages (a row per shard under a stage with
shards), the notes under it (printed whole), and the end of its log."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from relevo_cli.commands.common import add_column
from relevo_cli.words import artifact_stage, error_sentence, format_duration, seconds_between, shard_name
from relevo_core.jobs.reconciliations import reconciled_line, reconciled_status
from relevo_core.models.status import queue_reason_words
from relevo_core.models.transfer import TransferProgress, human_bytes


def gate_line(job_id: str, stage: str) -> str:
    """What a job waiting at its approval gate needs, and the command that gives it."""
    return (
        f"waiting for approval before {stage}: `relevo job approve {job_id}` (or `relevo job reject "
        f"{job_id} --reason …`)"
    )


def render_job(job: dict[str, Any], now: datetime | None = None) -> Table:
    """A row per stage; a stage with shards has a row per shard under it (its label: its index or
    its matrix combination), each with the Mac that ran it, its attempt, duration and result."""
    now = now or datetime.now(UTC)
    # The title stays short (rich wraps it to the table's width): why it waits is a note below.
    table = Table(title=f"{job['job_id']}  {job['project']}  [bold]{job['status']}[/bold]")
    for column in ("#", "stage", "status", "attempt", "agent", "duration", "exit", "error", "transfer"):
        add_column(table, column)
    for stage in job["stages"]:
        table.add_row(
            str(stage["index"]),
            escape(stage["name"]),
            *_attempt_cells(stage, now),
            transfer_text(stage.get("transfer")),
        )
        shards = stage.get("shards") or []
        for place, shard in enumerate(shards):
            branch = "└" if place == len(shards) - 1 else "├"
            table.add_row("", f"{branch} {escape(shard['label'])}", *_attempt_cells(shard, now), "")
    return table


def _attempt_cells(run: dict[str, Any], now: datetime) -> list[str]:
    """status, attempt, agent, duration, exit, error of a stage's or a shard's shown attempt."""
    seconds = seconds_between(run.get("started_at"), run.get("ended_at"), now)
    return [
        # `reconciled`: the attempt found the earlier one's effect done and did not run (its note says how).
        reconciled_status(run),
        str(run["attempt"] or ""),
        run["agent_id"] or "",
        "" if seconds is None else format_duration(seconds),
        "" if run["exit_code"] in (None, -1) else str(run["exit_code"]),
        run["error_class"] or "",
    ]


def transfer_text(transfer: dict[str, Any] | None) -> str:
    """What the attempt's artifact upload says: under way (files, bytes, percent) or its totals."""
    return TransferProgress.model_validate(transfer).describe() if transfer else ""


def job_notes(job: dict[str, Any]) -> list[str]:
    """Lines under a job's table (printed whole, never wrapped to the table's width): where it
    builds and stands, then its approval gate (waiting at it, or how it was answered). Only what
    is known: no "@" without a commit, no last successful stage before one succeeded."""
    ref = f"ref {job['ref']}" + (f" @ {job['commit'][:12]}" if job.get("commit") else "")
    parts = [ref, f"region {job['region_affinity']}"]
    if job.get("build_number") is not None:
        parts.append(f"build number {job['build_number']}")
    if job.get("last_successful_stage"):
        parts.append(f"last successful stage: {job['last_successful_stage']}")
    if job.get("last_writer"):
        parts.append(f"last writer: {job['last_writer']}")
    notes = [" · ".join(parts)]
    failure = error_sentence(job)
    if failure:
        notes.append(failure)
    if job.get("queue_reason"):
        notes.append(
            f"waiting ({job['queue_reason']}): "
            + queue_reason_words(job["queue_reason"], job.get("region_affinity"), job.get("queue_detail"))
        )
    for shard in job.get("waiting_shards") or []:
        why = (
            f"waiting ({shard['queue_reason']}): "
            + queue_reason_words(shard["queue_reason"], job.get("region_affinity"), shard.get("queue_detail"))
            if shard.get("queue_reason")
            else "about to be claimed"
        )
        notes.append(f"{shard['stage']} shard {shard['shard']} (attempt {shard['attempt']}) {why}")
    if job.get("held_reason"):
        notes.append(f"held ({job['held_reason']}): `relevo job release {job['job_id']}` starts it")
    if job.get("warning_stages"):
        warned = ", ".join(job["warning_stages"])
        notes.append(
            f"succeeded with warnings in {warned}"
            if job["status"] == "succeeded"
            else f"warnings so far in {warned}"
        )
        notes += [
            f"{stage['name']} warning: {stage['warning']}" for stage in job["stages"] if stage.get("warning")
        ]
    notes += reconciled_notes(job)
    if job.get("waiting_stage"):
        notes.append(gate_line(job["job_id"], job["waiting_stage"]))
    decision = job.get("approval_decision")
    if decision:
        reason = f": {decision['reason']}" if decision.get("reason") else ""
        notes.append(f"{decision['decision']} by {decision['actor']} before {decision['stage']}{reason}")
    for artifact in job.get("artifacts") or []:
        if artifact.get("removed_at"):
            notes.append(
                f"artifact {artifact_stage(artifact)}/{artifact['name']} ({artifact['size']} bytes) "
                f"removed by quota at {artifact['removed_at']} ({artifact['removed_reason']})"
            )
    # The table shows the transfer of each stage's current attempt; earlier attempts' go here.
    for stage in job["stages"]:
        for transfer in stage.get("transfers") or []:
            if transfer["attempt"] != stage.get("attempt"):
                notes.append(f"{stage['name']} attempt {transfer['attempt']}: {transfer_text(transfer)}")
    notes += handoff_notes(job)
    notes += cache_notes(job)
    return notes


def cache_notes(job: dict[str, Any]) -> list[str]:
    """Each stage's (and shard's) caches (docs/caches.md): hit, partial hit or miss, what it moved
    and in how long, and what its save did."""
    notes = []
    for stage in job["stages"]:
        places = [
            (stage["name"], stage),
            *((shard_name(stage["name"], s), s) for s in stage.get("shards") or []),
        ]
        notes += [
            cache_line(where, outcome) for where, found in places for outcome in found.get("caches") or []
        ]
    return notes


RESTORE_WORDS = {"hit": "hit", "partial": "partial hit", "miss": "miss"}


def cache_line(where: str, outcome: dict[str, Any]) -> str:
    """`build cache spm: partial hit spm/16C5032a-… (key spm/16C5032a-…): 312.4 MiB in 2.1s, 0 B
    downloaded; saved 313.0 MiB (1.2 MiB uploaded)`."""
    line = f"{where} cache {outcome['name']}: {RESTORE_WORDS[outcome['restore']]}"
    if outcome["restore"] == "miss":
        line += f" {outcome['key']}" if outcome.get("key") else ""
        line += f" ({outcome['reason']})" if outcome.get("reason") and not outcome.get("save") else ""
    else:
        if outcome["restore"] == "partial":
            line += f" {outcome['restored_key']} (key {outcome['key']})"
        else:
            line += f" {outcome['key']}"
        line += (
            f": {human_bytes(outcome['bytes'])} in {outcome['restore_seconds']:.1f}s, "
            f"{human_bytes(outcome['downloaded_bytes'])} downloaded"
        )
    save = outcome.get("save")
    if save == "saved":
        line += (
            f"; saved {human_bytes(outcome['saved_bytes'])} ({human_bytes(outcome['uploaded_bytes'])} "
            f"uploaded in {outcome['save_seconds']:.1f}s)"
        )
    elif save in ("not_saved", "failed", "skipped"):
        line += f"; {save.replace('_', ' ')}" + (f" ({outcome['reason']})" if outcome.get("reason") else "")
    return line


def reconciled_notes(job: dict[str, Any]) -> list[str]:
    """Each stage (or shard) whose attempt reconciled an earlier one's unknown outcome: what the
    probe found and what was done (`upload#2 reconciled on mac-t1: the effect of attempt 1 exists
    (probe exit 0); not run again`), every reconciliation of the stage, oldest first."""
    notes = []
    for stage in job["stages"]:
        entries = stage.get("reconciliations") or ([stage["reconciled"]] if stage.get("reconciled") else [])
        notes += [line for line in (reconciled_line(stage["name"], entry) for entry in entries) if line]
        for shard in stage.get("shards") or []:
            line = reconciled_line(shard_name(stage["name"], shard), shard.get("reconciled"))
            if line:
                notes.append(line)
    return notes


def handoff_notes(job: dict[str, Any]) -> list[str]:
    """What travelled between the stages (docs/handoff.md): each stage's files handed on, what its
    Mac restored, and its values."""
    notes = []
    for stage in job["stages"]:
        handoff = stage.get("handoff") or {}
        if handoff.get("digest"):
            notes.append(
                f"{stage['name']} handed on {handoff['files']} files, {handoff['symlinks']} symlinks, "
                f"{human_bytes(handoff['bytes'])} "
                f"(tree {handoff['digest'][:12]})"
            )
        if handoff.get("restored"):
            restored = handoff["restored"]
            notes.append(
                f"{stage['name']} restored {handoff['restored_files']} files from "
                f"{', '.join(restored['from_stages'])} on "
                f"{stage.get('agent_id') or 'its Mac'}: {human_bytes(handoff['restored_bytes'])} downloaded "
                f"(tree {str(handoff.get('restored_digest'))[:12]})"
            )
        for key, value in sorted((stage.get("outputs") or {}).items()):
            shown = value if len(value) <= 80 and "\n" not in value else value.splitlines()[0][:80] + " …"
            notes.append(f"{stage['name']} output {key}={shown}")
    return notes


def release_section(job: dict[str, Any]) -> list[str]:
    """Each stage with a built-in release effect (docs/release-effects.md): its kind and where it
    stands in a line, the identifiers it recorded (whole: the ids to quote to Apple), Apple's state,
    and for a stage held for review what the reconcile's probe found."""
    lines = []
    for stage in job["stages"]:
        effect = stage.get("effect")
        if not effect:
            continue
        lines.append(f"{stage['name']} ({effect['kind']}, {stage['status']}): {effect['words']}")
        lines += [f"  {key} {value}" for key, value in effect["identifiers"].items()]
        if effect.get("state"):
            lines.append(f"  Apple's state {effect['state']}")
        if effect.get("evidence"):
            lines.append(f"  held for review: {effect['evidence']}")
    return ["── release ──", *lines] if lines else []


STATUS_LOG_LINES = 20


def log_tail(job: dict[str, Any]) -> list[str]:
    """The last lines of the job's log, under its table (the API sends up to 200: --json has them)."""
    tail = job.get("log_tail") or {"lines": []}
    lines = tail["lines"][-STATUS_LOG_LINES:]
    if not lines:
        return []
    labels = {
        (stage["name"], shard["shard"]): shard["label"]
        for stage in job["stages"]
        for shard in stage.get("shards") or []
    }
    shown = [f"── last {len(lines)} log lines ──"]
    for line in lines:
        # A shard's line is labelled with its shard: `test[device=iPhone 16, os=18.2]#1 | …`.
        where = (
            line["stage"]
            if line.get("shard") is None
            else f"{line['stage']}[{labels.get((line['stage'], line['shard']), line['shard'])}]"
        )
        shown.append(f"{where}#{line['attempt']} | {line['text']}")
    job_id = job["job_id"]
    return [
        *shown,
        f"(all of it: relevo job logs {job_id}; follow: relevo job logs {job_id} -f --from-seq "
        f"{tail['next_seq']})",
    ]


def view(job: dict[str, Any]) -> list[RenderableType | str]:
    """`relevo job view`: the job's table, its notes, its release effects, the end of its log."""
    return [render_job(job), *job_notes(job), *release_section(job), *log_tail(job)]
