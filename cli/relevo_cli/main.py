"""`relevo`: the operator CLI. This module only assembles it; each command group, with its
rendering, is a module of relevo_cli.commands."""

from __future__ import annotations

import typer

from relevo_cli.cli_errors import RelevoGroup, set_debug
from relevo_cli.commands import advise, agents, artifacts, console, dlq, drill, groups, jobs, local, projects, queue, stack

app = typer.Typer(cls=RelevoGroup, no_args_is_help=True, help="Relevo: one job per trigger, relayed across your Macs.")


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", envvar="RELEVO_DEBUG", help="show the traceback of any error"),
) -> None:
    set_debug(ctx, debug)


# The order is the order `relevo --help` lists them in: the top-level commands first, then the
# sub-apps.
COMMANDS = (
    ("status", jobs.status),
    ("jobs", jobs.jobs),
    ("run", jobs.run),
    ("rerun", jobs.rerun),
    ("approve", jobs.approve),
    ("reject", jobs.reject),
    ("cancel", jobs.cancel),
    ("release", queue.release),
    ("queue", queue.queue),
    ("promote", queue.promote),
    ("logs", jobs.logs),
    ("drill", drill.drill_command),
    ("console", console.console_command),
    ("deliveries", groups.deliveries),
    ("advise", advise.advise_command),
)
SUB_APPS = (
    ("local", local.local_app),
    ("project", projects.project_app),
    ("dlq", dlq.dlq_app),
    ("job", jobs.job_app),
    ("stack", stack.stack_app),
    ("aws", stack.aws_app),
    ("artifacts", artifacts.artifacts_app),
    ("group", groups.group_app),
    ("agents", agents.agents_app),
)
for name, command in COMMANDS:
    app.command(name)(command)
for name, sub_app in SUB_APPS:
    app.add_typer(sub_app, name=name)


if __name__ == "__main__":
    app()
