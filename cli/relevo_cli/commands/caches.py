"""`relevo cache list|show|delete`: a project's cache entries in one region (docs/caches.md), as the
table holds them: key, size, files, last used, hits. A refusal is one line, exit 2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.commands.common import StackOption, console, errors, listing, open_stack, print_json
from relevo_core.models.transfer import human_bytes

cache_app = typer.Typer(no_args_is_help=True, help="A project's caches: entries, their size, use and hits.")

RegionOption = typer.Option(None, "--region", help="the region's caches (default: the project's region)")
JsonOption = typer.Option(False, "--json", help="print the answer as JSON")


def _ask(stack_file: Path | None, call: Callable[[RelevoApi], Any]) -> Any:
    """The API's answer; a refusal printed on one line, exit 2."""
    try:
        return call(RelevoApi.for_stack(open_stack(stack_file)))
    except ApiError as exc:
        errors.print(str(exc).replace("\n", " "), style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc


def entry_row(entry: dict[str, Any]) -> tuple[str, ...]:
    return (
        entry["cache_key"],
        human_bytes(entry["size"]),
        str(entry["files"]),
        entry["last_used_at"],
        str(entry["hits"]),
        entry["created_at"],
    )


@cache_app.command("list")
def cache_list(
    project: str = typer.Argument(..., help="the project"),
    region: str | None = RegionOption,
    as_json: bool = JsonOption,
    stack_file: Path | None = StackOption,
) -> None:
    """The project's cache entries, most recently used first, and its total against its limit."""
    listed = _ask(stack_file, lambda api: api.caches(project, region))
    if as_json:
        print_json(listed)
        return
    title = (
        f"{listed['count']} cache entries of {listed['project']} in {listed['region']}: "
        f"{human_bytes(listed['total_bytes'])} of {human_bytes(listed['max_total_bytes'])}, "
        f"unused entries kept {listed['retention_days']} days"
    )
    columns = ("key", "size", "files", "last used", "hits", "created")
    console.print(listing(title, columns, map(entry_row, listed["entries"])))


@cache_app.command("show")
def cache_show(
    project: str = typer.Argument(..., help="the project"),
    key: str = typer.Argument(..., help="the entry's key, as `relevo cache list` shows it"),
    region: str | None = RegionOption,
    as_json: bool = JsonOption,
    stack_file: Path | None = StackOption,
) -> None:
    """One entry: its size, files, when it was saved and last used, its hits, and who saved it."""
    entry = _ask(stack_file, lambda api: api.cache_entry(project, key, region))
    if as_json:
        print_json(entry)
        return
    for name in (
        "cache_key",
        "region",
        "size",
        "files",
        "created_at",
        "last_used_at",
        "hits",
        "job_id",
        "stage",
    ):
        value = human_bytes(entry[name]) if name == "size" else entry[name]
        console.print(f"{name}: {value}", markup=False, highlight=False)


@cache_app.command("delete")
def cache_delete(
    project: str = typer.Argument(..., help="the project"),
    key: str = typer.Argument(..., help="the entry's key"),
    region: str | None = RegionOption,
    as_json: bool = JsonOption,
    stack_file: Path | None = StackOption,
) -> None:
    """Delete one entry (needs operate): the next job with its key misses and saves it again."""
    deleted = _ask(stack_file, lambda api: api.delete_cache_entry(project, key, region))
    if as_json:
        print_json(deleted)
        return
    console.print(
        f"deleted cache entry {deleted['deleted']} of {deleted['project']} in {deleted['region']} "
        f"({human_bytes(deleted['size'])})",
        markup=False,
        highlight=False,
    )
