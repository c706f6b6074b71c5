"""`relevo-agent`: run the agent on a Mac (or any POSIX host)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import typer

from relevo_agent import launchd
from relevo_agent.config import AgentConfig
from relevo_agent.launch import run_agent
from relevo_agent.launch import stack_target as _resources
from relevo_core.files.private import write_private
from relevo_core.files.user_written import InvalidFile

app = typer.Typer(no_args_is_help=True, help="relevo-agent: runs Relevo stages on this Mac.")
_DEBUG = "relevo.debug"


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="show the traceback of a config error"),
) -> None:
    """relevo-agent commands."""
    ctx.meta[_DEBUG] = debug


@app.command()
def run(
    ctx: typer.Context,
    config: Path = typer.Option(..., "--config", exists=True, dir_okay=False, help="agent TOML file"),
    follow_stack: bool = typer.Option(
        False,
        "--follow-stack",
        help="when the stack file names another stack (a local stack restarted), start again "
        "against it instead of exiting (`relevo local agent` runs agents so)",
    ),
) -> None:
    """Long-poll the region's work queue and run the stages it hands out."""
    raise typer.Exit(run_agent(config, debug=bool(ctx.meta.get(_DEBUG)), follow_stack=follow_stack))


@app.command()
def schema() -> None:
    """Print the config's JSON Schema (editors validate and complete with it; see docs/agent-config.md)."""
    import json

    from relevo_core.files.user_written import file_schema

    typer.echo(json.dumps(file_schema(AgentConfig), indent=2))


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
        target = _resources(settings, path)
    except InvalidFile as exc:  # a config or stack file that cannot be read is the first thing to fix
        for mistake in exc.mistakes:
            typer.echo(f"FAIL  config: {mistake}")
        raise typer.Exit(1) from exc
    typer.echo(
        f"ok    config: {path} (agent {settings.agent_id}, region {settings.region}, capacity "
        f"{settings.capacity})"
    )
    checks = run_checks(
        settings, target.table, target.queue_url, target.no_queue, stack=target.stack, config_path=path
    )
    for check in checks:
        typer.echo(check.line())
    failed = [c.name for c in checks if not c.ok]
    if failed:
        typer.echo(f"{len(failed)} problem(s): {', '.join(failed)}")
        raise typer.Exit(1)
    typer.echo("all checks passed")


def agent_toml(
    agent_id: str, region: str, capacity: int, stack_file: Path, aws_profile: str | None, home: Path
) -> str:
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
    return (
        '# Written by relevo-agent init; see docs/operations.md, "Connect a Mac".\n' + "\n".join(lines) + "\n"
    )


@app.command()
def init(
    stack: str = typer.Option(..., "--stack", help="the deployed stack's CloudFormation name"),
    region_affinity: str = typer.Option(
        ..., "--region-affinity", help="which of the stack's work queues this Mac serves"
    ),
    config: Path = _CONFIG_OPTION,
    agent_id: str = typer.Option(None, help="this Mac's agent id (default: its host name)"),
    capacity: int = typer.Option(2, min=1, help="stages this Mac runs at once"),
    profile: str | None = typer.Option(
        None, help="AWS profile that takes the region's agent role (kept in the config)"
    ),
    region: str | None = typer.Option(
        None, help="AWS region of the stack (default: your AWS configuration's)"
    ),
    endpoint_url: str | None = typer.Option(
        None, help="an AWS endpoint other than AWS's (the local stack's emulator)"
    ),
    force: bool = typer.Option(False, help="replace an existing config"),
) -> None:
    """Write this Mac's agent config from a deployed stack, then run doctor."""
    import boto3

    from relevo_core.files.stack import StackProblem, read_stack, write_stack_file

    path = config.expanduser()
    if path.exists() and not force:
        typer.echo(f"{path} exists: pass --force to replace it", err=True)
        raise typer.Exit(2)
    try:
        info = read_stack(
            stack, boto3.session.Session(region_name=region, profile_name=profile), endpoint_url
        )
    except StackProblem as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    if region_affinity not in info.work_queues:
        typer.echo(
            f"stack {stack} has no work queue for region affinity {region_affinity!r}; it has "
            f"{', '.join(sorted(info.work_queues))}",
            err=True,
        )
        raise typer.Exit(2)
    home = path.parent
    stack_file = write_stack_file(info.model_copy(update={"aws_profile": profile}), home / "stack.json")
    write_private(
        path,
        agent_toml(agent_id or socket.gethostname(), region_affinity, capacity, stack_file, profile, home),
    )
    AgentConfig.load(path)  # what was written is what the agent reads
    typer.echo(f"wrote {path} (stack {stack}, region affinity {region_affinity}) and {stack_file}")
    doctor(config=path)


service_app = typer.Typer(
    no_args_is_help=True, help="Run the agent as a launchd service of this user, or as root (macOS)."
)
app.add_typer(service_app, name="service")
_LABEL_OPTION = typer.Option(
    launchd.DEFAULT_LABEL, "--label", help="launchd label (one per agent on this Mac)"
)
_DAEMON_OPTION = typer.Option(
    False,
    "--daemon",
    help="a LaunchDaemon run by root (/Library/LaunchDaemons): the agent of a config with run_as",
)
# Where a LaunchDaemon's plist and logs go (tests point it elsewhere).
SYSTEM_ROOT = Path("/")


def _paths(label: str, daemon: bool = False) -> launchd.ServicePaths:
    return launchd.ServicePaths(home=SYSTEM_ROOT if daemon else Path.home(), label=label, daemon=daemon)


@service_app.command("install")
def service_install(
    config: Path = _CONFIG_OPTION, label: str = _LABEL_OPTION, daemon: bool = _DAEMON_OPTION
) -> None:
    """Write ~/Library/LaunchAgents/LABEL.plist (KeepAlive, logs in ~/Library/Logs/relevo-agent) and load it;
    with --daemon, /Library/LaunchDaemons/LABEL.plist (logs in /Library/Logs/relevo-agent)."""
    path = config.expanduser()
    if not path.is_file():
        raise typer.BadParameter(f"{path} does not exist", param_hint="--config")
    try:
        settings = AgentConfig.load(path)  # refuse to install a config the agent could not start with
    except InvalidFile as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    # Root runs stages only as a build user, and a build user needs root to start its stages.
    if daemon and settings.run_as is None:
        typer.echo(
            f"{path}: --daemon runs the agent as root: set run_as, so that its stages run as a build user",
            err=True,
        )
        raise typer.Exit(2)
    if settings.run_as is not None and not daemon:
        typer.echo(f"{path}: run_as needs the agent to run as root: install it with --daemon", err=True)
        raise typer.Exit(2)
    load = launchd.launchctl_available()
    for line in launchd.install(path, _paths(label, daemon), load=load):
        typer.echo(line)
    if not load:
        typer.echo("launchctl is not available (not macOS): the plist was written but not loaded")


@service_app.command("uninstall")
def service_uninstall(label: str = _LABEL_OPTION, daemon: bool = _DAEMON_OPTION) -> None:
    """Stop the service, unload it and remove its plist."""
    for line in launchd.uninstall(_paths(label, daemon), unload=launchd.launchctl_available()):
        typer.echo(line)


@service_app.command("status")
def service_status(label: str = _LABEL_OPTION, daemon: bool = _DAEMON_OPTION) -> None:
    """Whether the service is installed and running; exit 1 when it is not running."""
    running, words = launchd.status(_paths(label, daemon), query=launchd.launchctl_available())
    typer.echo(words)
    if not running:
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
