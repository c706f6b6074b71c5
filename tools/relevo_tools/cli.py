"""`relevo-tools`: the development tools that run as commands. Installed with relevo-tools (beside
relevo-cli, relevo-local and the agent), never with the operator CLI alone.

    relevo-tools drill all --trials 3
"""

from __future__ import annotations

import typer

from relevo_tools.drill.command import drill_command

app = typer.Typer(no_args_is_help=True, help="Relevo's development tools.")


@app.callback()
def _tools() -> None:
    """A group even while it has one command: `relevo-tools drill …`, never `relevo-tools …`."""


app.command("drill")(drill_command)


if __name__ == "__main__":
    app()
