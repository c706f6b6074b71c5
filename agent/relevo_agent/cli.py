"""`relevo-agent`: run the agent on a Mac (or any POSIX host)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Optional

import typer

from relevo_agent import launchd
from relevo_agent.config import AgentConfig
from relevo_agent.service import Agent
from relevo_core.stackfile import StackInfo, load_stack

app = typer.Typer(no_args_is_help=True, help="relevo-agent: runs Relevo stages on this Mac.")


@app.callback()
def _root() -> None:
    """relevo-agent commands."""


def _stack(settings: AgentConfig) -> StackInfo | None:
    """The stack file's stack, boto3 pointed at it (endpoint, region, credentials), or None."""
    if settings.aws_profile:
        # The profile of the Mac's AWS configuration that takes the agent role (README).
        os.environ["AWS_PROFILE"] = settings.aws_profile
    if settings.stack_file is None:
        if settings.aws_region:
            os.environ.setdefault("AWS_REGION", settings.aws_region)
            os.environ.setdefault("AWS_DEFAULT_REGION", settings.aws_region)
        return None
    stack = load_stack(settings.stack_file)
    # A local stack gives its agents a session of their region's agent role.
    stack.apply_to_environment(agent_region=settings.region)
    return stack


def _resources(settings: AgentConfig) -> tuple[str | None, str | None]:
    """The table and the region's work queue, from the stack file or the explicit names; points
    boto3 at the stack's endpoint and region."""
    stack = _stack(settings)
    if stack is not None:
        return stack.table_name, stack.work_queues.get(settings.region)
    return settings.table_name, settings.queue_url


@app.command()
def run(config: Path = typer.Option(..., "--config", exists=True, dir_okay=False, help="agent TOML file")) -> None:
    """Long-poll the region's work queue and run the stages it hands out."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = AgentConfig.load(config)
    table, queue_url = _resources(settings)
    if not table or not queue_url:
        raise typer.BadParameter(f"no table or work queue for region {settings.region!r}: set stack_file or table_name and queue_url")
    agent = Agent(settings, table, queue_url)

    def _count(signum: int, _frame: object) -> None:
        # Only count: the supervisor loop decides (1 drain, 2 cancel running stages, 3 exit now).
        agent.signals += 1

    signal.signal(signal.SIGTERM, _count)
    signal.signal(signal.SIGINT, _count)
    raise typer.Exit(agent.run())


DEFAULT_CONFIG = Path("~/relevo/agent.toml")
_CONFIG_OPTION = typer.Option(DEFAULT_CONFIG, "--config", dir_okay=False, help="agent TOML file")


@app.command()
def doctor(config: Path = _CONFIG_OPTION) -> None:
    """Check credentials, the table and work queue, the clock and disk space; exit 1 if anything is wrong."""
    from relevo_agent.doctor import run_checks

    path = config.expanduser()
    if not path.is_file():
        typer.echo(f"FAIL  config: {path} does not exist")
        raise typer.Exit(1)
    try:
        settings = AgentConfig.load(path)
        stack = _stack(settings)
        table, queue_url = (stack.table_name, stack.work_queues.get(settings.region)) if stack else (settings.table_name, settings.queue_url)
    except Exception as exc:  # a config or stack file that cannot be read is the first thing to fix
        typer.echo(f"FAIL  config: {path}: {exc}")
        raise typer.Exit(1) from exc
    typer.echo(f"ok    config: {path} (agent {settings.agent_id}, region {settings.region}, capacity {settings.capacity})")
    checks = run_checks(settings, table, queue_url, stack=stack)
    for check in checks:
        typer.echo(check.line())
    failed = [c.name for c in checks if not c.ok]
    if failed:
        typer.echo(f"{len(failed)} problem(s): {', '.join(failed)}")
        raise typer.Exit(1)
    typer.echo("all checks passed")


def agent_toml(agent_id: str, region: str, capacity: int, stack_file: Path, aws_profile: str | None, home: Path) -> str:
    """The TOML `relevo-agent init` writes (every value one the config model validates)."""
    values: dict[str, object] = {
        "agent_id": agent_id,
        "region": region,
        "capacity": capacity,
        "workspace_root": str(home / "workspaces"),
        "journal": str(home / "journal.sqlite3"),
        "stack_file": str(stack_file),
    }
    if aws_profile:
        values["aws_profile"] = aws_profile
    # JSON strings are TOML basic strings for what these hold (no control characters).
    lines = [f"{name} = {json.dumps(value)}" for name, value in values.items()]
    return "# Written by relevo-agent init; see README, \"Connect a Mac\".\n" + "\n".join(lines) + "\n"


@app.command()
def init(
    stack: str = typer.Option(..., "--stack", help="the deployed stack's CloudFormation name"),
    region_affinity: str = typer.Option(..., "--region-affinity", help="which of the stack's work queues this Mac serves"),
    config: Path = _CONFIG_OPTION,
    agent_id: str = typer.Option(None, help="this Mac's agent id (default: its host name)"),
    capacity: int = typer.Option(2, min=1, help="stages this Mac runs at once"),
    profile: Optional[str] = typer.Option(None, help="AWS profile that takes the region's agent role (kept in the config)"),
    region: Optional[str] = typer.Option(None, help="AWS region of the stack (default: your AWS configuration's)"),
    endpoint_url: Optional[str] = typer.Option(None, help="an AWS endpoint other than AWS's (the local stack's emulator)"),
    force: bool = typer.Option(False, help="replace an existing config"),
) -> None:
    """Write this Mac's agent config from a deployed stack, then run doctor."""
    import boto3

    from relevo_core.stackfile import StackProblem, read_stack, write_stack_file

    path = config.expanduser()
    if path.exists() and not force:
        typer.echo(f"{path} exists: pass --force to replace it", err=True)
        raise typer.Exit(2)
    try:
        info = read_stack(stack, boto3.session.Session(region_name=region, profile_name=profile), endpoint_url)
    except StackProblem as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    if region_affinity not in info.work_queues:
        typer.echo(f"stack {stack} has no work queue for region affinity {region_affinity!r}; it has {', '.join(sorted(info.work_queues))}", err=True)
        raise typer.Exit(2)
    home = path.parent
    stack_file = write_stack_file(info.model_copy(update={"aws_profile": profile}), home / "stack.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(agent_toml(agent_id or socket.gethostname(), region_affinity, capacity, stack_file, profile, home))
    AgentConfig.load(path)  # what was written is what the agent reads
    typer.echo(f"wrote {path} (stack {stack}, region affinity {region_affinity}) and {stack_file}")
    doctor(config=path)


service_app = typer.Typer(no_args_is_help=True, help="Run the agent as a launchd service of this user (macOS).")
app.add_typer(service_app, name="service")
_LABEL_OPTION = typer.Option(launchd.DEFAULT_LABEL, "--label", help="launchd label (one per agent on this Mac)")


def _paths(label: str) -> launchd.ServicePaths:
    return launchd.ServicePaths(home=Path.home(), label=label)


@service_app.command("install")
def service_install(config: Path = _CONFIG_OPTION, label: str = _LABEL_OPTION) -> None:
    """Write ~/Library/LaunchAgents/LABEL.plist (KeepAlive, logs in ~/Library/Logs/relevo-agent) and load it."""
    path = config.expanduser()
    if not path.is_file():
        raise typer.BadParameter(f"{path} does not exist", param_hint="--config")
    AgentConfig.load(path)  # refuse to install a config the agent could not start with
    load = launchd.launchctl_available()
    for line in launchd.install(path, _paths(label), load=load):
        typer.echo(line)
    if not load:
        typer.echo("launchctl is not available (not macOS): the plist was written but not loaded")


@service_app.command("uninstall")
def service_uninstall(label: str = _LABEL_OPTION) -> None:
    """Stop the service, unload it and remove its plist."""
    for line in launchd.uninstall(_paths(label), unload=launchd.launchctl_available()):
        typer.echo(line)


@service_app.command("status")
def service_status(label: str = _LABEL_OPTION) -> None:
    """Whether the service is installed and running; exit 1 when it is not running."""
    running, words = launchd.status(_paths(label), query=launchd.launchctl_available())
    typer.echo(words)
    if not running:
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
