"""The console's Starlette app, assembled: each page's routes (relevo_cli.console.routes), its
static files, and the guard in front of them all.

Nothing in the console decides what a caller may do: a refusal is the API's (its status and body
are passed on), and the buttons' enabled state is only a probe of it (relevo_cli.console.actions).
The app takes the API it talks to as an argument (relevo_cli.console.state.Console), so the same
pages can later sit behind another authentication (a per-user RelevoApi) without a rewrite.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from relevo_cli.console.render import HERE
from relevo_cli.console.routes import caches, deliveries, dlq, fleet, job, job_tests, jobs, queue, run
from relevo_cli.console.security import ConsoleSecrets, guarded
from relevo_cli.console.state import Console

# Each page's routes module (their paths do not overlap, so the order is free).
PAGES = (jobs, queue, run, dlq, fleet, deliveries, caches, job, job_tests)


def create_app(
    console: Console,
    console_secrets: ConsoleSecrets,
    port: int,
    announce: Callable[[str], None] | None = None,
) -> ASGIApp:
    """The console's routes behind its guard; `announce` gets a new sign-in link when a spent one
    is opened by a browser without the session (relevo_cli.console.security)."""
    routes = [route for page in PAGES for route in page.ROUTES]
    app = Starlette(routes=[*routes, Mount("/static", StaticFiles(directory=HERE / "static"), name="static")])
    app.state.console = console
    return guarded(app, console_secrets, port, announce)
