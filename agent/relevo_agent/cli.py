"""`relevo-agent`: run the agent on a Mac (or any POSIX host)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import typer

from relevo_agent import launchd
from relevo_agent.config import AgentConfig
from relevo_agent.service import Agent
from relevo_core.stackfile import load_stack

app = typer.Typer(no_args_is_help=True, help="relevo-agent: runs Relevo stages on this Mac.")


@app.callback()
def _root() -> None:
    """relevo-agent commands."""


def _resources(settings: AgentConfig) -> tuple[str | None, str | None]:
    """The table and the region's work queue, from the stack file or the explicit names; points
    boto3 at the stack's endpoint and region."""
    if settings.stack_file is not None:
        stack = load_stack(settings.stack_file)
        stack.apply_to_environment()
        return stack.table_name, stack.work_queues.get(settings.region)
    if settings.aws_region:
        os.environ.setdefault("AWS_REGION", settings.aws_region)
        os.environ.setdefault("AWS_DEFAULT_REGION", settings.aws_region)
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
    # Non-zero exits (launchd's KeepAlive restarts the agent): 2 another relevo-agent runs with
    # this agent_id, 3 the stack is gone or this agent_id was taken over; the log's last line says.
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
        table, queue_url = _resources(settings)
    except Exception as exc:  # a config or stack file that cannot be read is the first thing to fix
        typer.echo(f"FAIL  config: {path}: {exc}")
        raise typer.Exit(1) from exc
    typer.echo(f"ok    config: {path} (agent {settings.agent_id}, region {settings.region}, capacity {settings.capacity})")
    checks = run_checks(settings, table, queue_url)
    for check in checks:
        typer.echo(check.line())
    failed = [c.name for c in checks if not c.ok]
    if failed:
        typer.echo(f"{len(failed)} problem(s): {', '.join(failed)}")
        raise typer.Exit(1)
    typer.echo("all checks passed")


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
