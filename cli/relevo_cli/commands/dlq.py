"""`relevo dlq …`: the job dead-letter queue and its frozen idempotency keys."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from relevo_cli.cli_errors import JobId
from relevo_cli.commands.common import StackOption, add_column, console, print_trigger, stack_api

dlq_app = typer.Typer(no_args_is_help=True, help="The job dead-letter queue.")


@dlq_app.command("list")
def dlq_list(
    as_json: bool = typer.Option(False, "--json", help="print the entries and frozen keys as JSON"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Jobs that failed for good, newest first."""
    with stack_api(stack_file) as api:
        listing = api.dead_letters()
    if as_json:
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
        return
    table = Table(title=f"{listing['count']} dead-lettered jobs")
    for column in ("job", "project", "failed stage", "error", "attempts", "last good stage", "state"):
        add_column(table, column)
    for entry in listing["entries"]:
        failed_stage = entry["failed_stage"] or "-"
        if entry.get("failed_shards"):
            failed_stage += " (shard " + ", ".join(str(shard) for shard in entry["failed_shards"]) + ")"
        table.add_row(
            entry["job_id"], entry["project"], failed_stage, entry["error"],
            str(entry["attempts"] or "-"), entry["last_successful_stage"] or "-", entry["state"],
        )
    console.print(table)
    frozen = listing.get("frozen_keys") or []
    if frozen:
        keys = Table(title=f"{len(frozen)} frozen idempotency keys (automatic runs refused, no stage retries)")
        for column in ("idempotency key", "project", "frozen at", "entries"):
            add_column(keys, column)
        for record in frozen:
            keys.add_row(
                record["idempotency_key"], record["project"] or "-", record["frozen_at"] or "-",
                ", ".join(entry["job_id"] for entry in record["entries"]),
            )
        console.print(keys)
        console.print("lift a freeze with: relevo dlq unfreeze KEY")


@dlq_app.command("view")
def dlq_show(job_id: str = JobId, stack_file: Optional[Path] = StackOption) -> None:
    """One dead-lettered job, with everything needed to resume it."""
    with stack_api(stack_file) as api:
        sys.stdout.write(json.dumps(api.dead_letter(job_id), indent=2) + "\n")


@dlq_app.command("redrive")
def dlq_redrive(job_id: str = JobId, stack_file: Optional[Path] = StackOption) -> None:
    """Resume a dead-lettered job from its failed stage, under the same idempotency key."""
    with stack_api(stack_file) as api:
        print_trigger(api.redrive(job_id), api)


@dlq_app.command("unfreeze")
def dlq_unfreeze(key: str, stack_file: Optional[Path] = StackOption) -> None:
    """Lift the freeze of an idempotency key: automatic runs and stage retries resume."""
    with stack_api(stack_file) as api:
        result = api.unfreeze_key(key)
    console.print(f"idempotency key [bold]{result['idempotency_key']}[/bold] unfrozen")


# The older spelling.
dlq_app.command("show", hidden=True)(dlq_show)
