"""`relevo project …`: the project registry (apply, view, list, delete, schema, grant, grants) and
`project run` (commands/jobs.py). `project show` is the older spelling of `view`."""

from __future__ import annotations

from pathlib import Path

import typer

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.cli_errors import ProjectId
from relevo_cli.commands.common import (
    StackOption,
    console,
    fail,
    listing,
    open_stack,
    print_json,
    show,
    stack_api,
)

project_app = typer.Typer(
    no_args_is_help=True, help="Projects: apply a project file, list, view, run, delete; who may do what."
)


@project_app.command("apply")
def project_apply(file: Path, stack_file: Path | None = StackOption) -> None:
    """Validate and store a project; webhook secrets go to Secrets Manager."""
    from relevo_cli.projects import apply_loaded, load_project_file

    loaded = load_project_file(file)  # the file's own mistakes first: they need no stack
    stack = open_stack(stack_file)
    try:
        project = apply_loaded(stack, RelevoApi.for_stack(stack), loaded)
    except ApiError as exc:
        fail(exc)
    console.print(
        f"project [bold]{project['id']}[/bold] applied ({len(project['stages'])} stages, region "
        f"{project['region_affinity']})"
    )


@project_app.command("delete")
def project_delete(
    project_id: str = ProjectId,
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    stack_file: Path | None = StackOption,
) -> None:
    """Delete a project (needs manage): its schedules, grants and webhook secrets. Refused while a job of it
    is held, queued or running; its ended jobs stay."""
    from relevo_cli.projects import delete_secrets

    if not yes:
        typer.confirm(
            f"delete project {project_id} with its schedules, grants and webhook secrets?", abort=True
        )
    stack = open_stack(stack_file)
    try:
        result = RelevoApi.for_stack(stack).delete_project(project_id)
    except ApiError as exc:
        fail(exc)
    secrets = delete_secrets(stack, project_id)
    removed = [f"{result['schedules_removed']} schedule(s)", f"{result['grants_removed']} grant(s)"]
    removed += [f"secret {name}" for name in secrets]
    console.print(
        f"project {project_id} deleted with {', '.join(removed)}; its ended jobs stay (relevo job delete "
        "JOB removes one)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


@project_app.command("schema")
def project_schema() -> None:
    """Print the project file's JSON Schema (editors validate and complete with it; see
    docs/project-file.md)."""
    from relevo_cli.reference import project_file_schema

    print_json(project_file_schema())


@project_app.command("view")
def project_show(project_id: str = ProjectId, stack_file: Path | None = StackOption) -> None:
    """Print a project as stored (JSON)."""
    with stack_api(stack_file) as api:
        print_json(api.get_project(project_id))


project_app.command("show", hidden=True)(project_show)


@project_app.command("list")
def project_list(
    as_json: bool = typer.Option(False, "--json", help="print the projects as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """List registered projects."""
    show(
        stack_file,
        lambda api: api.list_projects(),
        as_json,
        lambda listed: [
            listing(
                f"{listed['count']} projects",
                ("id", "repo", "region", "stages", "priority"),
                (
                    (
                        project["id"],
                        project["repo"],
                        project["region_affinity"],
                        " → ".join(s["name"] for s in project["stages"]),
                        str(project["priority"]),
                    )
                    for project in listed["projects"]
                ),
            )
        ],
        as_data=lambda listed: listed["projects"],
    )


@project_app.command("grant")
def project_grant(
    project_id: str = ProjectId,
    principal: str = typer.Argument(
        ..., help="IAM user or role ARN; a trailing /* matches a role's sessions"
    ),
    level: str = typer.Argument(..., help="view, operate, manage, or none (revoke)"),
    stack_file: Path | None = StackOption,
) -> None:
    """Give a principal a level on a project (needs manage)."""
    with stack_api(stack_file) as api:
        result = api.grant(project_id, principal, level)
    console.print(f"{result['principal']} → [bold]{result['level']}[/bold] on {project_id}")


@project_app.command("grants")
def project_grants(
    project_id: str = ProjectId,
    as_json: bool = typer.Option(False, "--json", help="print the grants as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """Who may do what to a project (needs view)."""
    show(
        stack_file,
        lambda api: api.grants(project_id),
        as_json,
        lambda listed: [
            listing(
                f"{listed['count']} grants on {project_id}",
                ("principal", "level", "granted by"),
                (
                    (
                        grant["principal"],
                        grant["level"],
                        "(AdminPrincipals)" if grant.get("admin") else grant.get("granted_by", ""),
                    )
                    for grant in listed["grants"]
                ),
            )
        ],
        as_data=lambda listed: listed["grants"],
    )
