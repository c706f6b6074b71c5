"""`relevo stack use` / `relevo stack show`: the CLI (and agents) pointed at a deployed stack by
its CloudFormation name, with no stack file written by hand; and `relevo aws preflight`, what a
first deploy of that stack needs in an account."""

from __future__ import annotations

from pathlib import Path

import boto3
import typer
from botocore.exceptions import ProfileNotFound

from relevo_cli import deployed
from relevo_cli.commands.common import StackOption, console, errors
from relevo_core.checks import Verdict
from relevo_core.files.stack import (
    StackProblem,
    load_stack,
    read_stack,
    stack_file_in_use,
    user_stack_file,
    write_stack_file,
)

stack_app = typer.Typer(no_args_is_help=True, help="The deployed stack the CLI uses.")


@stack_app.command("use")
def stack_use(
    name: str = typer.Argument(..., help="the CloudFormation stack name (samconfig.toml's stack_name)"),
    region: str | None = typer.Option(
        None, help="AWS region of the stack (default: your AWS configuration's)"
    ),
    profile: str | None = typer.Option(None, help="AWS profile to read it with, and to use afterwards"),
    endpoint_url: str | None = typer.Option(
        None, help="an AWS endpoint other than AWS's (the local stack's emulator)"
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="write the stack file here (default: your user stack file)"
    ),
) -> None:
    """Read the stack's outputs and resources and make it the stack the CLI uses."""
    aws = boto3.session.Session(region_name=region, profile_name=profile)
    try:
        info = read_stack(name, aws, endpoint_url)
    except StackProblem as exc:
        errors.print(f"[red]{exc}[/red]", soft_wrap=True)
        raise typer.Exit(2) from exc
    if profile:
        info = info.model_copy(update={"aws_profile": profile})
    path = write_stack_file(info, output or user_stack_file())
    console.print(f"using stack {info.stack_name} in {info.region}: API {info.api_url}")
    console.print(f"work queues: {', '.join(info.work_queues)} · stack file {path}")


@stack_app.command("show")
def stack_show(stack_file: Path | None = StackOption) -> None:
    """Which stack the CLI uses, and whether it can be reached with these credentials."""
    path, why = stack_file_in_use(stack_file)
    try:
        info = load_stack(path)
    except FileNotFoundError as exc:
        errors.print(f"[red]{exc}[/red]", soft_wrap=True)
        raise typer.Exit(2) from exc
    console.print(f"stack {info.stack_name} in {info.region} ({why}: {path})")
    console.print(
        f"API {info.api_url} · table {info.table_name} · work queues: {', '.join(info.work_queues)}"
    )
    info.apply_to_environment()
    checks = deployed.check_reachable(info, boto3.session.Session(region_name=info.region))
    for check in checks:
        console.print(check.line())
    if not all(check.ok for check in checks):
        raise typer.Exit(1)


aws_app = typer.Typer(no_args_is_help=True, help="Checks of an AWS account for Relevo.")
REPO_ROOT = Path(__file__).resolve().parents[3]


@aws_app.command("preflight")
def aws_preflight(
    region: str | None = typer.Option(
        None, help="the region to deploy to (default: your AWS configuration's)"
    ),
    profile: str | None = typer.Option(None, help="AWS profile to check with"),
    stack_name: str | None = typer.Option(None, help="stack name (default: samconfig.toml's)"),
    reserved_concurrency: bool | None = typer.Option(
        None,
        "--reserved-concurrency/--no-reserved-concurrency",
        help="the ReservedConcurrency parameter (default: samconfig.toml's, else off)",
    ),
    access_logging: bool | None = typer.Option(
        None,
        "--access-logging/--no-access-logging",
        help="the ApiAccessLogging parameter (default: samconfig.toml's, else off)",
    ),
    endpoint_url: str | None = typer.Option(
        None, help="an AWS endpoint other than AWS's (the local emulator)"
    ),
) -> None:
    """Check, read-only, what a first `sam deploy` needs in this account and region."""
    from relevo_cli import preflight

    plan = preflight.deploy_plan(REPO_ROOT, stack_name, reserved_concurrency, access_logging)
    try:
        session = boto3.session.Session(region_name=region, profile_name=profile)
    except ProfileNotFound as exc:
        findings = [preflight.credentials_finding(exc)]
    else:
        findings = preflight.preflight(plan, session, endpoint_url)
    for finding in findings:
        console.print(finding.line(), soft_wrap=True)
    if any(finding.verdict is Verdict.FIX for finding in findings):
        raise typer.Exit(1)
