"""`relevo`: the operator CLI. This module only assembles it; each command group, with its
rendering, is a module of relevo_cli.commands.

One grammar, a noun then a verb, as `gh` has it: `relevo job list|view|logs|watch|approve|…`,
`relevo project apply|run|…`, `relevo agent list|pause|…`. The older spellings (`relevo status`,
`relevo jobs`, `relevo run`, `relevo approve`, `relevo logs`, `relevo agents`, …) still work and
are hidden from --help."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from relevo_cli.cli_errors import RelevoGroup, print_version, set_debug
from relevo_cli.commands import (
    advise,
    agents,
    artifacts,
    caches,
    console,
    dlq,
    groups,
    job_tests,
    jobs,
    local,
    projects,
    queue,
    stack,
)

app = typer.Typer(
    cls=RelevoGroup, no_args_is_help=True, help="Relevo: one job per trigger, relayed across your Macs."
)


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(
        False, "--debug", envvar="RELEVO_DEBUG", help="show the traceback of any error"
    ),
    version: bool = typer.Option(
        False, "--version", callback=print_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    set_debug(ctx, debug)


# `relevo job …`, in the order `relevo job --help` lists them.
JOB_COMMANDS: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("list", jobs.jobs),
    ("view", jobs.status),
    ("logs", jobs.logs),
    ("tests", job_tests.tests),
    ("watch", jobs.watch),
    ("approve", jobs.approve),
    ("reject", jobs.reject),
    ("cancel", jobs.cancel),
    ("rerun", jobs.rerun),
    ("promote", queue.promote),
    ("release", queue.release),
)
for name, command in reversed(JOB_COMMANDS):
    # resolve, priority and delete are registered in commands/jobs.py; these go before them.
    jobs.job_app.registered_commands.insert(0, typer.models.CommandInfo(name=name, callback=command))
jobs.job_app.command("show", hidden=True)(jobs.status)
projects.project_app.command("run")(jobs.run)

# The nouns, in the order `relevo --help` lists them; then the commands that are no noun's.
SUB_APPS = (
    ("job", jobs.job_app),
    ("project", projects.project_app),
    ("queue", queue.queue_app),
    ("agent", agents.agent_app),
    ("region", agents.region_app),
    ("artifact", artifacts.artifact_app),
    ("cache", caches.cache_app),
    ("dlq", dlq.dlq_app),
    ("group", groups.group_app),
    ("delivery", groups.delivery_app),
    ("local", local.local_app),
    ("stack", stack.stack_app),
    ("aws", stack.aws_app),
)
COMMANDS = (
    ("console", console.console_command),
    ("advise", advise.advise_command),
)
# The older spellings: they still work, and --help leaves them out.
HIDDEN_COMMANDS = (
    ("status", jobs.status),
    ("jobs", jobs.jobs),
    ("run", jobs.run),
    ("rerun", jobs.rerun),
    ("approve", jobs.approve),
    ("reject", jobs.reject),
    ("cancel", jobs.cancel),
    ("release", queue.release),
    ("promote", queue.promote),
    ("logs", jobs.logs),
    ("deliveries", groups.deliveries),
)
HIDDEN_APPS = (
    ("agents", agents.agents_app),
    ("artifacts", artifacts.artifacts_app),
)
for name, sub_app in SUB_APPS:
    app.add_typer(sub_app, name=name)
for name, command in COMMANDS:
    app.command(name)(command)
for name, command in HIDDEN_COMMANDS:
    app.command(name, hidden=True)(command)
for name, sub_app in HIDDEN_APPS:
    app.add_typer(sub_app, name=name, hidden=True)


if __name__ == "__main__":
    app()
