"""`relevo console`: serve the web console on 127.0.0.1, signing every API call with the
operator's own AWS credentials (as the CLI does). The first line printed is the URL to open,
token included."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import typer

from relevo_cli.api import RelevoApi
from relevo_cli.commands.common import StackOption, console, errors, open_stack


def console_command(
    port: int = typer.Option(
        8765, "--port", min=0, max=65535, help="the loopback port to serve on (0: any free one)"
    ),
    no_open: bool = typer.Option(False, "--no-open", help="print the URL only; do not open a browser"),
    git_base_url: str | None = typer.Option(
        None,
        "--git-base-url",
        envvar="RELEVO_GIT_BASE_URL",
        help="where the run page's `git ls-remote` finds repositories (default: GitHub's or GitLab's)",
    ),
    stack_file: Path | None = StackOption,
) -> None:
    """Serve the web console on 127.0.0.1 (Ctrl-C stops it)."""
    from relevo_cli.console.server import ConsoleServer
    from relevo_cli.console.state import Console

    api = RelevoApi.for_stack(open_stack(stack_file))
    try:
        server = ConsoleServer(Console(api, git_base_url=git_base_url), port=port)
    except OSError as exc:
        errors.print(f"[red]relevo console: cannot listen on 127.0.0.1:{port}: {exc.strerror}[/red]")
        raise typer.Exit(2) from exc
    print(server.url, flush=True)
    console.print(
        "serving on 127.0.0.1 only; the token in that URL is the key and works once (another browser then "
        "gets a fresh link printed here): Ctrl-C stops the console",
        highlight=False,
    )
    if not no_open:
        webbrowser.open(server.url)
    server.serve()
