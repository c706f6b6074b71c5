"""`relevo project …`: the project registry (apply, schema, show, list, grant, grants)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.cli_errors import ProjectId
from relevo_cli.commands.common import StackOption, console, fail, open_stack, stack_api

project_app = typer.Typer(no_args_is_help=True, help="The project registry.")


@project_app.command("apply")
def project_apply(file: Path, stack_file: Optional[Path] = StackOption) -> None:
    """Validate and store a project; webhook secrets go to Secrets Manager."""
    from relevo_cli.projects import apply_loaded, load_project_file

    loaded = load_project_file(file)  # the file's own mistakes first: they need no stack
    stack = open_stack(stack_file)
    try:
        project = apply_loaded(stack, RelevoApi.for_stack(stack), loaded)
    except ApiError as exc:
        fail(exc)
    console.print(f"project [bold]{project['id']}[/bold] applied ({len(project['stages'])} stages, region {project['region_affinity']})")


@project_app.command("schema")
def project_schema() -> None:
    """Print the project file's JSON Schema (editors validate and complete with it; see docs/project-file.md)."""
    from relevo_cli.reference import project_file_schema

    sys.stdout.write(json.dumps(project_file_schema(), indent=2) + "\n")


@project_app.command("show")
def project_show(project_id: str = ProjectId, stack_file: Optional[Path] = StackOption) -> None:
    """Print a project as stored."""
    with stack_api(stack_file) as api:
        sys.stdout.write(json.dumps(api.get_project(project_id), indent=2) + "\n")


@project_app.command("list")
def project_list(stack_file: Optional[Path] = StackOption) -> None:
    """List registered projects."""
    with stack_api(stack_file) as api:
        listing = api.list_projects()
    table = Table(title=f"{listing['count']} projects")
    for column in ("id", "repo", "region", "stages", "priority"):
        table.add_column(column)
    for project in listing["projects"]:
        table.add_row(
            project["id"], project["repo"], project["region_affinity"], " → ".join(s["name"] for s in project["stages"]), str(project["priority"])
        )
    console.print(table)


@project_app.command("grant")
def project_grant(
    project_id: str = ProjectId,
    principal: str = typer.Argument(..., help="IAM user or role ARN; a trailing /* matches a role's sessions"),
    level: str = typer.Argument(..., help="view, operate, manage, or none (revoke)"),
    stack_file: Optional[Path] = StackOption,
) -> None:
    """Give a principal a level on a project (needs manage)."""
    with stack_api(stack_file) as api:
        result = api.grant(project_id, principal, level)
    console.print(f"{result['principal']} → [bold]{result['level']}[/bold] on {project_id}")


@project_app.command("grants")
def project_grants(project_id: str = ProjectId, stack_file: Optional[Path] = StackOption) -> None:
    """Who may do what to a project (needs view)."""
    with stack_api(stack_file) as api:
        listing = api.grants(project_id)
    table = Table(title=f"{listing['count']} grants on {project_id}")
    for column in ("principal", "level", "granted by"):
        table.add_column(column)
    for grant in listing["grants"]:
        table.add_row(grant["principal"], grant["level"], "(AdminPrincipals)" if grant.get("admin") else grant.get("granted_by", ""))
    console.print(table)
