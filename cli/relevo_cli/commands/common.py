"""What every command group shares: the consoles, the --stack-file option, the stack and its API
(a refusal printed as its code and message, exit 1), and how a triggered job is reported."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.stackfile import StackInfo, load_stack

# Piped (not a terminal, no COLUMNS), a table is as wide as its cells: nothing is cut to 80
# columns, an id least of all (scripts have --json).
PIPED_WIDTH = 400


def _width() -> int | None:
    return None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPED_WIDTH


# One console for the whole CLI: it takes its width when created (tests widen this one).
console = Console(width=_width())
errors = Console(stderr=True)
# Columns holding ids (job, agent, project, key): folded onto a second line in a narrow terminal,
# never cut with an ellipsis.
ID_COLUMNS = frozenset(
    {"job", "agent", "id", "project", "idempotency key", "principal", "job / reason", "entries"}
)


# A job id's length (job_ and 26 characters): the job column keeps it on one line, the other
# columns give way first.
JOB_ID_WIDTH = 30


def add_column(table: Table, name: str, **options: Any) -> None:
    """A column of a listing; an id column is never cut short (ID_COLUMNS): a job id stays on one
    line, another id folds onto a second one rather than end in `…`."""
    if name in ID_COLUMNS:
        options.setdefault("overflow", "fold")
    if name == "job":
        options.setdefault("min_width", JOB_ID_WIDTH)
        options.setdefault("no_wrap", True)
    table.add_column(name, **options)


StackOption = typer.Option(
    None, "--stack-file", envvar="RELEVO_STACK_FILE", help="stack.json of the stack to use"
)


def open_stack(stack_file: Path | None) -> StackInfo:
    """The stack the CLI uses, applied to this process's environment; exit 2 when there is none."""
    try:
        stack = load_stack(stack_file)
    except FileNotFoundError as exc:
        errors.print(str(exc), style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc
    stack.apply_to_environment()
    return stack


def fail(exc: ApiError) -> None:
    errors.print(str(exc), style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@contextmanager
def stack_api(stack_file: Path | None) -> Iterator[RelevoApi]:
    """The API of the stack, with a refusal printed as its code and message (exit 1)."""
    api = RelevoApi.for_stack(open_stack(stack_file))
    try:
        yield api
    except ApiError as exc:
        fail(exc)


# How a duplicate's existing job is named, by its status.
_ALREADY = {
    "queued": "already queued as",
    "held": "already held as",
    "succeeded": "already ran as",
    "failed": "already ran as",
    "canceled": "already ran as",
}
# The exit status of a command that started nothing because the same work is already a job (its
# id is printed): 0 is a new job, 1 a refusal, 2 a mistake on the command line.
EXIT_DUPLICATE = 3


# `-q` / `--json` of every command that starts a job (project run, job rerun, job release, dlq
# redrive): the id alone on stdout, or the API's answer with the job's status (print_trigger).
def quiet_option(example: str) -> Any:
    return typer.Option(False, "--quiet", "-q", help=f"print only the job id ({example})")


JsonTriggerOption = typer.Option(False, "--json", help="print the answer as JSON: job_id, duplicate, status")


def print_trigger(
    result: dict, api: RelevoApi, again: str | None = None, quiet: bool = False, as_json: bool = False
) -> None:
    """A new job, or the job a duplicate is: with its status (one more call), and for an ended
    one the command (`again`) that runs the same work anew. `quiet`: the id alone on stdout (what
    a duplicate is goes to stderr); `as_json`: the API's answer with the job's status. A duplicate
    exits EXIT_DUPLICATE, so a script tells it from a new job."""
    job_id = result["job_id"]
    duplicate = bool(result.get("duplicate"))
    status = api.get_job(job_id)["status"] if duplicate else result.get("outcome", "queued")
    if as_json:
        sys.stdout.write(json.dumps({**result, "duplicate": duplicate, "status": status}, indent=2) + "\n")
    elif quiet:
        sys.stdout.write(job_id + "\n")
    elif not duplicate:
        console.print(f"job [bold]{job_id}[/bold] {result.get('outcome', 'queued')}")
    if not duplicate:
        return
    line = f"{_ALREADY.get(status, 'already running as')} {job_id} ({status})"
    if again and _ALREADY.get(status) == "already ran as":
        line += f"; `{again}` runs it again"
    if not as_json:
        (errors if quiet else console).print(line, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_DUPLICATE)
