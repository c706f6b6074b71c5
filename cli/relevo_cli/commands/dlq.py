"""`relevo dlq …`: the job dead-letter queue and its frozen idempotency keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from relevo_cli.cli_errors import JobId
from relevo_cli.commands.common import (
    JsonTriggerOption,
    StackOption,
    add_column,
    console,
    listing,
    print_trigger,
    quiet_option,
    show,
    stack_api,
)

dlq_app = typer.Typer(no_args_is_help=True, help="The job dead-letter queue.")


@dlq_app.command("list")
def dlq_list(
    as_json: bool = typer.Option(False, "--json", help="print the entries and frozen keys as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """Jobs that failed for good, newest first."""
    show(stack_file, lambda api: api.dead_letters(), as_json, _dead_letter_tables)


def _dead_letter_tables(dead: dict[str, Any]) -> list[Any]:
    """The entries, then the idempotency keys frozen (and how a freeze is lifted)."""
    columns = ("job", "project", "failed stage", "error", "attempts", "last good stage", "state")
    shown: list[Any] = [
        listing(f"{dead['count']} dead-lettered jobs", columns, map(_entry_row, dead["entries"]))
    ]
    frozen = dead.get("frozen_keys") or []
    if frozen:
        shown.append(
            listing(
                f"{len(frozen)} frozen idempotency keys (automatic runs refused, no stage retries)",
                ("idempotency key", "project", "frozen at", "entries"),
                (
                    (
                        record["idempotency_key"],
                        record["project"] or "-",
                        record["frozen_at"] or "-",
                        ", ".join(entry["job_id"] for entry in record["entries"]),
                    )
                    for record in frozen
                ),
            )
        )
        shown.append("lift a freeze with: relevo dlq unfreeze KEY")
    return shown


def _entry_row(entry: dict[str, Any]) -> tuple[str, ...]:
    failed_stage = entry["failed_stage"] or "-"
    if entry.get("failed_shards"):
        failed_stage += " (shard " + ", ".join(str(shard) for shard in entry["failed_shards"]) + ")"
    return (
        entry["job_id"],
        entry["project"],
        failed_stage,
        entry["error"],
        str(entry["attempts"] or "-"),
        entry["last_successful_stage"] or "-",
        entry["state"],
    )


def _text(value: Any) -> str:
    """A field as a cell: a structured cause as compact JSON, nothing as `-`."""
    if value is None or value == "":
        return "-"
    return value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))


def render_dead_letter(entry: dict[str, Any]) -> list[Any]:
    """One dead-letter entry as `relevo job view` shows a job: a table of what failed and where it
    stands (the failed stage and its shards, error class, attempts and backoff, the last good
    stage, the cause, its key and whether it was redriven), a row per failed shard, and the
    command that resumes it."""
    table = Table(
        title=f"{entry['job_id']}  {entry['project']}  [bold]{entry['state']}[/bold]", show_header=False
    )
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    failed_stage = entry.get("failed_stage") or "-"
    if entry.get("failed_shards"):
        failed_stage += " (shard " + ", ".join(str(shard) for shard in entry["failed_shards"]) + ")"
    backoff = entry.get("cumulative_backoff_sec")
    for name, value in (
        ("failed stage", failed_stage),
        ("error", entry.get("error")),
        ("attempts", entry.get("attempts")),
        ("backoff", None if backoff is None else f"{backoff}s in all"),
        ("last good stage", entry.get("last_successful_stage")),
        ("cause", entry.get("cause")),
        ("failed at", entry.get("failed_at")),
        ("idempotency key", entry.get("idempotency_key")),
        ("redriven as", entry.get("redriven_as")),
    ):
        table.add_row(name, escape(_text(value)))
    shown: list[Any] = [table]
    if entry.get("shard_failures"):
        shards = Table(
            title=f"{len(entry['shard_failures'])} failed shards of "
            f"{entry.get('failed_stage') or 'its stage'}"
        )
        for column in ("shard", "error", "attempts", "backoff", "cause"):
            add_column(shards, column)
        for shard in entry["shard_failures"]:
            shards.add_row(
                str(shard["shard"]),
                _text(shard.get("error_class")),
                _text(shard.get("attempts")),
                "-" if shard.get("cumulative_backoff_sec") is None else f"{shard['cumulative_backoff_sec']}s",
                escape(_text(shard.get("cause"))),
            )
        shown.append(shards)
    if entry.get("redriven_as"):
        shown.append(f"redriven as {entry['redriven_as']}: `relevo job view {entry['redriven_as']}`")
    elif entry.get("state") == "open":
        where = f" from {entry['failed_stage']}" if entry.get("failed_stage") else ""
        shown.append(
            f"`relevo dlq redrive {entry['job_id']}` resumes it{where}, under the same idempotency key"
        )
    return shown


@dlq_app.command("view")
def dlq_show(
    job_id: str = JobId,
    as_json: bool = typer.Option(False, "--json", help="print the entry as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """One dead-lettered job, with everything needed to resume it."""
    show(stack_file, lambda api: api.dead_letter(job_id), as_json, render_dead_letter)


@dlq_app.command("redrive")
def dlq_redrive(
    job_id: str = JobId,
    quiet: bool = quiet_option("NEW=$(relevo dlq redrive JOB -q)"),
    as_json: bool = JsonTriggerOption,
    stack_file: Path | None = StackOption,
) -> None:
    """Resume a dead-lettered job from its failed stage, under the same idempotency key."""
    with stack_api(stack_file) as api:
        print_trigger(api.redrive(job_id), api, quiet=quiet, as_json=as_json)


@dlq_app.command("unfreeze")
def dlq_unfreeze(key: str, stack_file: Path | None = StackOption) -> None:
    """Lift the freeze of an idempotency key: automatic runs and stage retries resume."""
    with stack_api(stack_file) as api:
        result = api.unfreeze_key(key)
    console.print(f"idempotency key [bold]{result['idempotency_key']}[/bold] unfrozen")


# The older spelling.
dlq_app.command("show", hidden=True)(dlq_show)
