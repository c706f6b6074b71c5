"""`relevo artifact list|download`: the files the stages of a job uploaded, downloaded with their
sha256 checked. `relevo artifact list|get` is the older spelling (a hidden alias)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from relevo_cli.cli_errors import JobId
from relevo_cli.commands.common import StackOption, add_column, console, errors, stack_api
from relevo_cli.words import artifact_stage


def removal_note(artifact: dict) -> str | None:
    """'removed by quota at T' for an artifact artifact.max_total_bytes removed (no download link)."""
    if not artifact.get("removed_at"):
        return None
    return f"removed by quota at {artifact['removed_at']}"


artifact_app = typer.Typer(
    no_args_is_help=True, help="Files the stages of a job uploaded: list them, download one."
)
artifacts_app = typer.Typer(no_args_is_help=True, help="Files the stages of a job uploaded.")


@artifact_app.command("list")
@artifacts_app.command("list")
def artifacts_list(
    job_id: str = JobId,
    as_json: bool = typer.Option(False, "--json", help="print the artifacts as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """A job's artifacts, with the sha256 recorded at upload."""
    with stack_api(stack_file) as api:
        job = api.get_job(job_id)
    if as_json:
        sys.stdout.write(json.dumps(job["artifacts"], indent=2) + "\n")
        return
    table = Table(title=f"{len(job['artifacts'])} artifact(s) of {job_id}")
    for column in ("stage", "name", "size", "sha256", "stored"):
        add_column(table, column)
    for artifact in job["artifacts"]:
        table.add_row(
            artifact_stage(artifact),
            artifact["name"],
            str(artifact["size"]),
            artifact["sha256"],
            "removed" if artifact.get("removed_at") else "yes",
        )
    console.print(table)
    # Whole lines under the table (never wrapped to a column's width).
    for artifact in job["artifacts"]:
        note = removal_note(artifact)
        if note:
            console.print(
                f"{artifact_stage(artifact)}/{artifact['name']}: {note} ({artifact['removed_reason']})",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )


@artifact_app.command("download")
@artifacts_app.command("get")
def artifacts_get(
    job_id: str = JobId,
    name: str = typer.Argument(..., help="the file's path under the stage's artifact directory"),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="file or directory to write (default: its name, here)"
    ),
    stage: str | None = typer.Option(None, "--stage", help="the stage that uploaded it (when several did)"),
    shard: int | None = typer.Option(
        None,
        "--shard",
        min=0,
        help="the shard (its index) of a stage with shards that uploaded it (when several did)",
    ),
    stack_file: Path | None = StackOption,
) -> None:
    """Download an artifact (presigned link valid 2 minutes) and verify its sha256."""
    from relevo_cli.artifacts import ChecksumMismatch, download

    with stack_api(stack_file) as api:
        link = api.artifact_link(job_id, name, stage, shard)
    try:
        path = download(link, output or Path(Path(name).name))
    except ChecksumMismatch as exc:
        errors.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from exc
    console.print(f"{path} ({link['size']} bytes, sha256 {link['sha256']} verified)")
