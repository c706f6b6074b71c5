"""The run order: `relevo queue` (jobs waiting, why, and every agent's load), `promote`, and
`release` (a held job into the queue)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from relevo_cli.cli_errors import JobId
from relevo_cli.commands.common import StackOption, console, print_trigger, stack_api


def release(job_id: str = JobId, stack_file: Optional[Path] = StackOption) -> None:
    """Release a held job (a pull request from a fork, or a repeat after its dedup window) into the queue."""
    with stack_api(stack_file) as api:
        print_trigger(api.release_job(job_id), api)


def queue(
    as_json: bool = typer.Option(False, "--json", help="print the queue as JSON"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Jobs waiting to run, in order, with why each waits (the project's lock, or no free agent), and every agent's load."""
    with stack_api(stack_file) as api:
        view = api.queue()
    if as_json:
        sys.stdout.write(json.dumps(view, indent=2) + "\n")
        return
    waiting = view.get("waiting_for_agent", [])
    title = f"{view['count']} queued job(s){' (more not shown)' if view['truncated'] else ''}"
    jobs_table = Table(title=title + (f", {len(waiting)} running job(s) waiting for an agent" if waiting else ""))
    for column in ("#", "job", "project", "priority", "region", "trigger", "ref", "queued since", "why waiting"):
        jobs_table.add_column(column, justify="right" if column in ("#", "priority") else "left")
    # A dispatched stage is already past the project's lock: it goes to the first free agent.
    for job in waiting:
        why = f"{job['queue_reason'] or 'about to be claimed'}: stage {job['stage']} on the {job['region_affinity']} queue"
        jobs_table.add_row(
            "-", job["job_id"], job["project"], str(job["priority"]), job["region_affinity"] or "",
            job["trigger"] or "", job["ref"] or "", (job["dispatched_at"] or job["created_at"] or "")[:19], why,
        )
    for job in view["jobs"]:
        jobs_table.add_row(
            str(job["queue_position"]), job["job_id"], job["project"], str(job["priority"]), job["region_affinity"] or "",
            job["trigger"] or "", job["ref"] or "", (job["created_at"] or "")[:19], job["queue_reason"] or "",
        )
    console.print(jobs_table)
    agents_table = Table(title=f"{len(view['agents'])} agent(s)")
    for column in ("agent", "region", "used / capacity", "version", "last seen", "state"):
        agents_table.add_column(column)
    for agent in view["agents"]:
        agents_table.add_row(
            agent["agent_id"], agent["region"], f"{agent['used']} / {agent['capacity']}", agent["version"],
            agent["last_seen"][:19], "[green]online[/green]" if agent["online"] else "[red]offline[/red]",
        )
    console.print(agents_table)


def promote(job_id: str = JobId, stack_file: Optional[Path] = StackOption) -> None:
    """Move a queued job to the front: its priority becomes the highest queued priority + 1."""
    with stack_api(stack_file) as api:
        result = api.promote_job(job_id)
    console.print(f"job [bold]{result['job_id']}[/bold] promoted: priority {result['previous_priority']} -> {result['priority']}")
