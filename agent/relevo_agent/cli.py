"""`relevo-agent`: run the agent on a Mac (or any POSIX host)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import typer

from relevo_agent.config import AgentConfig
from relevo_agent.service import Agent
from relevo_core.stackfile import load_stack

app = typer.Typer(no_args_is_help=True, help="relevo-agent: runs Relevo stages on this Mac.")


@app.callback()
def _root() -> None:
    """relevo-agent commands."""


@app.command()
def run(config: Path = typer.Option(..., "--config", exists=True, dir_okay=False, help="agent TOML file")) -> None:
    """Long-poll the region's work queue and run the stages it hands out."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = AgentConfig.load(config)
    if settings.stack_file is not None:
        stack = load_stack(settings.stack_file)
        stack.apply_to_environment()
        table, queue_url = stack.table_name, stack.work_queues.get(settings.region)
    else:
        table, queue_url = settings.table_name, settings.queue_url
    if not table or not queue_url:
        raise typer.BadParameter(f"no table or work queue for region {settings.region!r}: set stack_file or table_name and queue_url")
    agent = Agent(settings, table, queue_url)

    def _count(signum: int, _frame: object) -> None:
        # Only count: the supervisor loop decides (1 drain, 2 cancel running stages, 3 exit now).
        agent.signals += 1

    signal.signal(signal.SIGTERM, _count)
    signal.signal(signal.SIGINT, _count)
    raise typer.Exit(agent.run())


if __name__ == "__main__":
    app()
