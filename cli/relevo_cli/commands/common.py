"""What every command group shares: the consoles, the --stack-file option, the stack and its API
(a refusal printed as its code and message, exit 1), and how a triggered job is reported."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import typer
from rich.console import Console

from relevo_cli.api import ApiError, RelevoApi
from relevo_agent.stackfile import StackInfo, load_stack

# One console for the whole CLI: it takes its width when created (tests widen this one).
console = Console()
errors = Console(stderr=True)

StackOption = typer.Option(None, "--stack-file", envvar="RELEVO_STACK_FILE", help="stack.json of the stack to use")


def open_stack(stack_file: Optional[Path]) -> StackInfo:
    """The stack the CLI uses, applied to this process's environment; exit 2 when there is none."""
    try:
        stack = load_stack(stack_file)
    except FileNotFoundError as exc:
        errors.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    stack.apply_to_environment()
    return stack


def fail(exc: ApiError) -> None:
    errors.print(f"[red]{exc}[/red]")
    raise typer.Exit(1)


@contextmanager
def stack_api(stack_file: Optional[Path]) -> Iterator[RelevoApi]:
    """The API of the stack, with a refusal printed as its code and message (exit 1)."""
    api = RelevoApi.for_stack(open_stack(stack_file))
    try:
        yield api
    except ApiError as exc:
        fail(exc)


# How a duplicate's existing job is named, by its status.
_ALREADY = {"queued": "already queued as", "held": "already held as", "succeeded": "already ran as",
            "failed": "already ran as", "canceled": "already ran as"}


def print_trigger(result: dict, api: RelevoApi, again: str | None = None) -> None:
    """A new job, or the job a duplicate is: with its status (one more call), and for an ended
    one the command (`again`) that runs the same work anew."""
    if not result.get("duplicate"):
        console.print(f"job [bold]{result['job_id']}[/bold] {result.get('outcome', 'queued')}")
        return
    job_id = result["job_id"]
    status = api.get_job(job_id)["status"]
    line = f"{_ALREADY.get(status, 'already running as')} {job_id} ({status})"
    if again and _ALREADY.get(status) == "already ran as":
        line += f"; `{again}` runs it again"
    console.print(line, markup=False, highlight=False, soft_wrap=True)
