"""`relevo-agent run` as the agent starts under launchd or the local stack: `python -m
relevo_agent.launch --config FILE`, the long-running agent without the command-line framework.

An idle agent's memory is a budget (bench/agent.py, at most 55 MB): typer and click take about
5 MB of it and serve only to read two options, so the agent's own entry reads them with argparse.
`relevo-agent run` (relevo_agent.cli) is the same run, for a person at a terminal.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from relevo_agent.config import AgentConfig, config_mistake
from relevo_core.files.stack import StackInfo, load_stack
from relevo_core.files.user_written import InvalidFile

if TYPE_CHECKING:
    from relevo_agent.service import Agent


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


def stack_target(settings: AgentConfig, config: Path) -> StackTarget:
    """The table and the region's work queue, from the stack file or the explicit names; points
    boto3 at the stack's endpoint and region. A stack file that cannot be read is a mistake of
    the config that names it."""
    if settings.aws_profile:
        # The profile of the Mac's AWS configuration that takes the agent role (docs/operations.md, "Connect a
        # Mac").
        os.environ["AWS_PROFILE"] = settings.aws_profile
    if settings.stack_file is not None:
        try:
            stack = load_stack(settings.stack_file)
        except FileNotFoundError as exc:
            raise config_mistake(config, ("stack_file",), str(exc)) from exc
        except ValueError as exc:
            raise config_mistake(
                config, ("stack_file",), f"{settings.stack_file} is not a stack.json ({type(exc).__name__})"
            ) from exc
        # A local stack gives its agents a session of their region's agent role.
        stack.apply_to_environment(agent_region=settings.region)
        queue_url = stack.work_queues.get(settings.region)
        regions = ", ".join(sorted(stack.work_queues)) or "none"
        no_queue = (
            None
            if queue_url
            else (
                f"no work queue for region {settings.region!r} in the stack {settings.stack_file} (its "
                f"region affinities: {regions})"
            )
        )
        return StackTarget(stack.table_name, queue_url, stack.api_url, no_queue, stack)
    if settings.aws_region:
        os.environ.setdefault("AWS_REGION", settings.aws_region)
        os.environ.setdefault("AWS_DEFAULT_REGION", settings.aws_region)
    missing = [name for name in ("table_name", "queue_url", "api_url") if not getattr(settings, name)]
    no_queue = (
        f"{' and '.join(missing)} not set: set stack_file, or table_name, queue_url and api_url"
        if missing
        else None
    )
    return StackTarget(settings.table_name, settings.queue_url, settings.api_url, no_queue)


def startable(config: Path) -> tuple[AgentConfig, StackTarget]:
    """The config and the stack it points at, refused before anything starts when the config has
    a mistake or its region has no work queue in the stack."""
    settings = AgentConfig.load(config)
    from relevo_agent.checkout import inside_git_work_tree

    repository = inside_git_work_tree(settings.workspace_root)
    if repository is not None:
        raise config_mistake(
            config,
            ("workspace_root",),
            f"{settings.workspace_root} is inside the git work tree {repository}: git in a stage, or the "
            "checkout's "
            "git clean, would act on that repository; choose a directory outside it",
        )
    target = stack_target(settings, config)
    if target.no_queue:
        unset = next(
            (name for name in ("table_name", "queue_url", "api_url") if not getattr(settings, name)),
            "queue_url",
        )
        raise config_mistake(
            config, ("region",) if settings.stack_file is not None else (unset,), target.no_queue
        )
    return settings, target


# The libraries' own INFO lines ("Found credentials in environment variables.") are not the
# agent's to say: its log is what it does.
QUIET_LOGGERS = ("botocore", "boto3", "urllib3", "s3transfer")
STACK_FILE_WAIT_SEC = 0.5


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def run_agent(config: Path, debug: bool = False, follow_stack: bool = False) -> int:
    """Run the agent of `config` until it is shut down; its exit status. A mistake in the config
    is one line naming the file, line and key (status 2; its traceback with `debug`). With
    `follow_stack`, a stack file that comes to name another stack (a local stack restarted) starts
    the agent again against it, in this process, instead of exiting."""
    try:
        settings, target = startable(config)
    except InvalidFile as exc:
        if debug:
            raise
        print(str(exc), file=sys.stderr)
        return 2
    configure_logging()
    from relevo_agent.memory import fewer_arenas

    fewer_arenas()  # before any thread starts (relevo_agent.memory)
    from relevo_agent.service import Agent
    from relevo_core.aws import lean_endpoints

    lean_endpoints()  # 6 MB of an idle agent's 55 (relevo_core.aws)

    agent = Agent(
        settings, str(target.table), str(target.queue_url), api_url=target.api_url, follow_stack=follow_stack
    )

    def _count(signum: int, _frame: object) -> None:
        # Only count: the supervisor loop decides (1 drain, 2 cancel running stages, 3 exit now).
        agent.signal_name = signal.Signals(signum).name
        agent.signals += 1

    signal.signal(signal.SIGTERM, _count)
    signal.signal(signal.SIGINT, _count)
    # Non-zero exits (launchd's KeepAlive restarts the agent): 2 another relevo-agent runs with
    # this agent_id, 3 the stack is gone or this agent_id was taken over; the log's last line says.
    code = agent.run()
    if follow_stack and agent.stop.stack_moved and agent.signals == 0 and settings.stack_file is not None:
        return _start_again_with_the_stack(agent, settings.stack_file, debug, config)
    return code


def _start_again_with_the_stack(agent: Agent, stack_file: Path, debug: bool, config: Path) -> int:
    """This process again (same pid, its inherited locks kept) once the stack file names a stack
    other than the one that went away; a signal meanwhile ends the wait (exit 0)."""
    import time

    gone = agent.stack_identity()
    while agent.signals == 0:
        try:
            stack = load_stack(stack_file)
        except (OSError, ValueError):
            stack = None  # not there (the stack is down), or being written
        if (
            stack is not None
            and {
                "endpoint": stack.aws_endpoint,
                "table": stack.table_name,
                "queue": stack.work_queues.get(agent.config.region),
            }
            != gone
        ):
            logging.getLogger("relevo_agent").info(
                "the stack file %s names a running stack: starting again", stack_file
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.execv(
                sys.executable, [sys.executable, *launch_arguments(config, follow_stack=True, debug=debug)]
            )
        time.sleep(STACK_FILE_WAIT_SEC)
    return 0


def launch_arguments(config: Path, follow_stack: bool = False, debug: bool = False) -> list[str]:
    """The interpreter's arguments that run the agent of `config` (this module)."""
    return [
        "-m",
        "relevo_agent.launch",
        "--config",
        str(config),
        *(["--follow-stack"] if follow_stack else []),
        *(["--debug"] if debug else []),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m relevo_agent.launch", description="Run relevo-agent (as `relevo-agent run`)."
    )
    parser.add_argument("--config", type=Path, required=True, help="agent TOML file")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a config error")
    parser.add_argument(
        "--follow-stack",
        action="store_true",
        help="when the stack file names another stack (a local stack restarted), start again against it "
        "instead of exiting",
    )
    args = parser.parse_args(argv)
    if not args.config.is_file():
        parser.error(f"--config {args.config}: no such file")
    return run_agent(args.config, args.debug, args.follow_stack)


if __name__ == "__main__":
    sys.exit(main())
