"""How the `relevo` CLI reports what went wrong: a person's mistake (a file, an argument) is one
line per mistake and exit 2; a stack it cannot reach is one line and exit 1; anything else is one
line and exit 1 too. `--debug` (or RELEVO_DEBUG=1) lets the exception through, traceback and all."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import requests
import typer
from botocore.exceptions import NoCredentialsError, ProfileNotFound
from rich.console import Console
from typer.core import TyperGroup

if TYPE_CHECKING:
    # The context typer's commands are invoked with: its own copy of click's (typer >= 0.22).
    from typer._click import Context

from relevo_core.files.user_written import InvalidFile
from relevo_core.models.envelope import JOB_ID, PROJECT_ID

DEBUG_KEY = "relevo.debug"
_errors = Console(stderr=True)


class UserMistake(Exception):
    """Something the person typed that cannot work; the message says what to type instead."""


def _say(text: str) -> None:
    for line in text.splitlines() or [""]:
        _errors.print(line, style="red", markup=False, highlight=False, soft_wrap=True)


class RelevoGroup(TyperGroup):
    """The root command: every subcommand runs inside its invoke, so this is the one place that
    turns exceptions into the lines a person reads. Its help (and every subcommand's) shows no
    type tags (relevo_cli.help_text)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from relevo_cli.help_text import without_type_tags

        without_type_tags(self)  # type: ignore[arg-type]  # typer's copy of click.Command

    def list_commands(self, ctx: Context) -> list[str]:
        """The nouns first (job, project, …), then the commands that are no noun's (console, …)."""
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: not hasattr(self.commands[name], "commands"))

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except (
            typer.Exit,
            typer.Abort,
            typer.TyperException,
            BrokenPipeError,
        ):  # typer's own exits and usage errors
            raise
        except (InvalidFile, UserMistake) as exc:
            if ctx.meta.get(DEBUG_KEY):
                raise
            _say(str(exc))
            raise typer.Exit(2) from exc
        except requests.ConnectionError as exc:
            if ctx.meta.get(DEBUG_KEY):
                raise
            url = getattr(exc.request, "url", None) or "the stack's API"
            _say(f"cannot reach {url}: is the stack running? (`relevo local status`; --debug for details)")
            raise typer.Exit(1) from exc
        except ProfileNotFound as exc:
            if ctx.meta.get(DEBUG_KEY):
                raise
            # AWS_PROFILE (or a stack file's aws_profile) names a profile this machine does not have.
            _say(
                f"{exc}: `aws configure list-profiles` lists the profiles there are; set AWS_PROFILE to one "
                "of them (or unset it)"
            )
            raise typer.Exit(2) from exc
        except NoCredentialsError as exc:
            if ctx.meta.get(DEBUG_KEY):
                raise
            _say(
                "no AWS credentials found to sign with: set AWS_PROFILE, or run `aws configure` or `aws sso "
                "login` "
                "(a local stack's stack.json carries its own)"
            )
            raise typer.Exit(1) from exc
        except Exception as exc:
            if ctx.meta.get(DEBUG_KEY):
                raise
            _say(f"relevo failed: {type(exc).__name__}: {exc} (run with --debug for the traceback)")
            raise typer.Exit(1) from exc


def set_debug(ctx: typer.Context, debug: bool) -> None:
    ctx.meta[DEBUG_KEY] = debug


def print_version(shown: bool) -> None:
    """`relevo --version`: the CLI's version and the core's and agent's installed beside it."""
    if not shown:
        return
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    typer.echo(
        f"relevo {version('relevo-cli')} (relevo-core {version('relevo-core')}, relevo-agent "
        f"{version('relevo-agent')})"
    )
    raise typer.Exit()


def _checker(pattern: str, what: str, example: str) -> Any:
    compiled = re.compile(pattern)

    def check(value: str | None) -> str | None:
        if value is not None and not compiled.match(value):
            raise UserMistake(f"{value!r} is not a {what} ({what}s look like {example})")
        return value

    return check


check_job_id = _checker(JOB_ID, "job id", "job_00mx2h2r7n38p1566llawdrdc6")
check_project_id = _checker(PROJECT_ID, "project id", "ios-app: lowercase letters, digits and '-'")

JobId = typer.Argument(..., callback=check_job_id, help="a job id (job_...)", show_default=False)
ProjectId = typer.Argument(..., callback=check_project_id, help="a project id", show_default=False)
