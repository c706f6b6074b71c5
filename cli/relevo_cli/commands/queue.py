"""The run order: `relevo queue list` (jobs waiting, why, and every agent's load; plain `relevo
queue` too), and `job promote` and `job release` (a held job into the queue)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from relevo_cli.cli_errors import JobId
from relevo_cli.commands.common import (
    JsonTriggerOption,
    StackOption,
    add_column,
    console,
    print_trigger,
    quiet_option,
    show,
    stack_api,
)
from relevo_core.models.status import queue_reason_words


def release(
    job_id: str = JobId,
    quiet: bool = quiet_option("relevo job release JOB -q"),
    as_json: bool = JsonTriggerOption,
    stack_file: Path | None = StackOption,
) -> None:
    """Release a held job (a pull request from a fork, or a repeat after its dedup window) into the queue."""
    with stack_api(stack_file) as api:
        print_trigger(api.release_job(job_id), api, quiet=quiet, as_json=as_json)


queue_app = typer.Typer(help="The run order: jobs waiting, why each waits, and every agent's load.")


@queue_app.callback(invoke_without_command=True)
def queue_command(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="print the queue as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """Jobs waiting to run, in order, with why each waits, and every agent's load (`relevo queue list` alone
    lists it too)."""
    if ctx.invoked_subcommand is None:
        queue(as_json, stack_file)


@queue_app.command("list")
def queue(
    as_json: bool = typer.Option(False, "--json", help="print the queue as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """Jobs waiting to run, in order, with why each waits (the project's lock, or no free agent), and every
    agent's load."""
    show(stack_file, lambda api: api.queue(), as_json, _queue_tables)


def _queue_tables(view: dict[str, Any]) -> list[Table]:
    """The jobs waiting (running ones waiting for an agent first, then the queue in run order),
    and every agent's load."""
    waiting = view.get("waiting_for_agent", [])
    title = f"{view['count']} queued job(s){' (more not shown)' if view['truncated'] else ''}"
    jobs_table = Table(
        title=title + (f", {len(waiting)} running job(s) waiting for an agent" if waiting else "")
    )
    for column in (
        "#",
        "job",
        "project",
        "priority",
        "region",
        "trigger",
        "ref",
        "queued since",
        "why waiting",
    ):
        add_column(jobs_table, column, justify="right" if column in ("#", "priority") else "left")
    # A dispatched stage is already past the project's lock: it goes to the first free agent.
    for job in waiting:
        reason = (
            queue_reason_words(job["queue_reason"], job["region_affinity"], job.get("queue_detail"))
            if job["queue_reason"]
            else "about to be claimed"
        )
        shard = f" shard {job['shard']}" if job.get("shard") is not None else ""
        why = f"stage {job['stage']}{shard}: {reason} ({job['queue_reason'] or 'free agent'})"
        jobs_table.add_row(
            "-",
            job["job_id"],
            job["project"],
            str(job["priority"]),
            job["region_affinity"] or "",
            job["trigger"] or "",
            job["ref"] or "",
            (job["dispatched_at"] or job["created_at"] or "")[:19],
            why,
        )
    for job in view["jobs"]:
        jobs_table.add_row(
            str(job["queue_position"]),
            job["job_id"],
            job["project"],
            str(job["priority"]),
            job["region_affinity"] or "",
            job["trigger"] or "",
            job["ref"] or "",
            (job["created_at"] or "")[:19],
            f"{queue_reason_words(job['queue_reason'], job['region_affinity'], job.get('queue_detail'))} "
            f"({job['queue_reason']})"
            if job["queue_reason"]
            else "",
        )
    agents_table = Table(title=f"{len(view['agents'])} agent(s)")
    for column in ("agent", "region", "used / capacity", "version", "last seen", "state"):
        add_column(agents_table, column)
    for agent in view["agents"]:
        agents_table.add_row(
            agent["agent_id"],
            agent["region"],
            f"{agent['used']} / {agent['capacity']}",
            agent["version"],
            agent["last_seen"][:19],
            "[green]online[/green]" if agent["online"] else "[red]offline[/red]",
        )
    return [jobs_table, agents_table]


def promote(job_id: str = JobId, stack_file: Path | None = StackOption) -> None:
    """Move a queued job to the front: its priority becomes the highest queued priority + 1."""
    with stack_api(stack_file) as api:
        result = api.promote_job(job_id)
    console.print(
        f"job [bold]{result['job_id']}[/bold] promoted: priority {result['previous_priority']} -> "
        f"{result['priority']}"
    )
