"""`relevo-agent`: run the agent on a Mac (or any POSIX host)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from relevo_agent import launchd
from relevo_agent.config import AgentConfig, config_mistake
from relevo_agent.private_files import write_private
from relevo_agent.service import Agent
from relevo_agent.stackfile import StackInfo, load_stack
from relevo_core.user_files import InvalidFile

app = typer.Typer(no_args_is_help=True, help="relevo-agent: runs Relevo stages on this Mac.")
_DEBUG = "relevo.debug"


@app.callback()
def _root(ctx: typer.Context, debug: bool = typer.Option(False, "--debug", help="show the traceback of a config error")) -> None:
    """relevo-agent commands."""
    ctx.meta[_DEBUG] = debug


@dataclass(frozen=True)
class StackTarget:
    table: str | None
    queue_url: str | None
    # The stack's API, where the agent claims its stages (None: not set).
    api_url: str | None
    # Why there is no work queue to poll, in words that say what to change (None: there is one).
    no_queue: str | None = None
    # The stack file's stack (None: explicit names of a deployed stack).
    stack: StackInfo | None = None


def _resources(settings: AgentConfig, config: Path) -> StackTarget:
    """The table and the region's work queue, from the stack file or the explicit names; points
    boto3 at the stack's endpoint and region. A stack file that cannot be read is a mistake of
    the config that names it."""
    if settings.aws_profile:
        # The profile of the Mac's AWS configuration that takes the agent role (docs/operations.md, "Connect a Mac").
        os.environ["AWS_PROFILE"] = settings.aws_profile
    if settings.stack_file is not None:
        try:
            stack = load_stack(settings.stack_file)
        except FileNotFoundError as exc:
            raise config_mistake(config, ("stack_file",), str(exc)) from exc
        except ValueError as exc:
            raise config_mistake(config, ("stack_file",), f"{settings.stack_file} is not a stack.json ({type(exc).__name__})") from exc
        # A local stack gives its agents a session of their region's agent role.
        stack.apply_to_environment(agent_region=settings.region)
        queue_url = stack.work_queues.get(settings.region)
        regions = ", ".join(sorted(stack.work_queues)) or "none"
        no_queue = None if queue_url else (
            f"no work queue for region {settings.region!r} in the stack {settings.stack_file} (its region affinities: {regions})"
        )
        return StackTarget(stack.table_name, queue_url, stack.api_url, no_queue, stack)
    if settings.aws_region:
        os.environ.setdefault("AWS_REGION", settings.aws_region)
        os.environ.setdefault("AWS_DEFAULT_REGION", settings.aws_region)
    missing = [name for name in ("table_name", "queue_url", "api_url") if not getattr(settings, name)]
    no_queue = f"{' and '.join(missing)} not set: set stack_file, or table_name, queue_url and api_url" if missing else None
    return StackTarget(settings.table_name, settings.queue_url, settings.api_url, no_queue)


def _startable(config: Path) -> tuple[AgentConfig, StackTarget]:
    """The config and the stack it points at, refused before anything starts when the config has
    a mistake or its region has no work queue in the stack."""
    settings = AgentConfig.load(config)
    from relevo_agent.checkout import inside_git_work_tree

    repository = inside_git_work_tree(settings.workspace_root)
    if repository is not None:
        raise config_mistake(
            config, ("workspace_root",),
            f"{settings.workspace_root} is inside the git work tree {repository}: git in a stage, or the checkout's "
            "git clean, would act on that repository; choose a directory outside it",
        )
    target = _resources(settings, config)
    if target.no_queue:
        unset = next((name for name in ("table_name", "queue_url", "api_url") if not getattr(settings, name)), "queue_url")
        raise config_mistake(config, ("region",) if settings.stack_file is not None else (unset,), target.no_queue)
    return settings, target


# The libraries' own INFO lines ("Found credentials in environment variables.") are not the
# agent's to say: its log is what it does.
QUIET_LOGGERS = ("botocore", "boto3", "urllib3", "s3transfer")
STACK_FILE_WAIT_SEC = 0.5


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@app.command()
def run(
    ctx: typer.Context,
    config: Path = typer.Option(..., "--config", exists=True, dir_okay=False, help="agent TOML file"),
    follow_stack: bool = typer.Option(
        False, "--follow-stack", help="when the stack file names another stack (a local stack restarted), start again "
        "against it instead of exiting (`relevo local agent` runs agents so)",
    ),
) -> None:
    """Long-poll the region's work queue and run the stages it hands out."""
    try:
        settings, target = _startable(config)
    except InvalidFile as exc:
        if ctx.meta.get(_DEBUG):
            raise
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    configure_logging()
    from relevo_agent.memory import fewer_arenas

    fewer_arenas()  # before any thread starts (relevo_agent.memory)
    agent = Agent(settings, str(target.table), str(target.queue_url), api_url=target.api_url, follow_stack=follow_stack)

    def _count(signum: int, _frame: object) -> None:
        # Only count: the supervisor loop decides (1 drain, 2 cancel running stages, 3 exit now).
        agent.signal_name = signal.Signals(signum).name
        agent.signals += 1

    signal.signal(signal.SIGTERM, _count)
    signal.signal(signal.SIGINT, _count)
    # Non-zero exits (launchd's KeepAlive restarts the agent): 2 another relevo-agent runs with
    # this agent_id, 3 the stack is gone or this agent_id was taken over; the log's last line says.
    code = agent.run()
    if follow_stack and agent.stack_moved and agent.signals == 0 and settings.stack_file is not None:
        _start_again_with_the_stack(agent, settings.stack_file, ctx.meta.get(_DEBUG, False), config)
    raise typer.Exit(code)


def _start_again_with_the_stack(agent: Agent, stack_file: Path, debug: bool, config: Path) -> None:
    """This process again (same pid, its inherited locks kept) once the stack file names a stack
    other than the one that went away; a signal meanwhile ends the wait (exit 0)."""
    import sys
    import time

    gone = agent.stack_identity()
    while agent.signals == 0:
        try:
            stack = load_stack(stack_file)
        except (OSError, ValueError):
            stack = None  # not there (the stack is down), or being written
        if stack is not None and {"endpoint": stack.aws_endpoint, "table": stack.table_name,
                                  "queue": stack.work_queues.get(agent.config.region)} != gone:
            logging.getLogger("relevo_agent").info("the stack file %s names a running stack: starting again", stack_file)
            for handler in logging.getLogger().handlers:
                handler.flush()
            argv = [sys.executable, "-m", "relevo_agent.cli", *(["--debug"] if debug else []), "run", "--config", str(config), "--follow-stack"]
            os.execv(sys.executable, argv)
        time.sleep(STACK_FILE_WAIT_SEC)
    raise typer.Exit(0)


@app.command()
def schema() -> None:
    """Print the config's JSON Schema (editors validate and complete with it; see docs/agent-config.md)."""
    import json

    from relevo_core.user_files import file_schema

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
    typer.echo(f"ok    config: {path} (agent {settings.agent_id}, region {settings.region}, capacity {settings.capacity})")
    checks = run_checks(settings, target.table, target.queue_url, target.no_queue, stack=target.stack, config_path=path)
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
    return "# Written by relevo-agent init; see docs/operations.md, \"Connect a Mac\".\n" + "\n".join(lines) + "\n"


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

    from relevo_agent.stackfile import StackProblem, read_stack, write_stack_file

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
    write_private(path, agent_toml(agent_id or socket.gethostname(), region_affinity, capacity, stack_file, profile, home))
    AgentConfig.load(path)  # what was written is what the agent reads
    typer.echo(f"wrote {path} (stack {stack}, region affinity {region_affinity}) and {stack_file}")
    doctor(config=path)


service_app = typer.Typer(no_args_is_help=True, help="Run the agent as a launchd service of this user, or as root (macOS).")
app.add_typer(service_app, name="service")
_LABEL_OPTION = typer.Option(launchd.DEFAULT_LABEL, "--label", help="launchd label (one per agent on this Mac)")
_DAEMON_OPTION = typer.Option(
    False, "--daemon", help="a LaunchDaemon run by root (/Library/LaunchDaemons): the agent of a config with run_as"
)
# Where a LaunchDaemon's plist and logs go (tests point it elsewhere).
SYSTEM_ROOT = Path("/")


def _paths(label: str, daemon: bool = False) -> launchd.ServicePaths:
    return launchd.ServicePaths(home=SYSTEM_ROOT if daemon else Path.home(), label=label, daemon=daemon)


@service_app.command("install")
def service_install(config: Path = _CONFIG_OPTION, label: str = _LABEL_OPTION, daemon: bool = _DAEMON_OPTION) -> None:
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
        typer.echo(f"{path}: --daemon runs the agent as root: set run_as, so that its stages run as a build user", err=True)
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
