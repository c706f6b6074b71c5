"""Serving the console: uvicorn on a socket bound to 127.0.0.1 only (never 0.0.0.0), in this
thread (`relevo console`) or a background one (tests, the benchmark, the demo)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import uvicorn

from relevo_cli.console.app import create_app
from relevo_cli.console.security import ConsoleSecrets
from relevo_cli.console.state import Console

LOOPBACK = "127.0.0.1"


def print_new_link(url: str) -> None:
    """Where `relevo console` runs: the link for another browser once the printed one was used."""
    print(
        "relevo console: that link was used already (a link signs one browser in, once); to sign in "
        f"another browser, open {url}",
        flush=True,
    )


class ConsoleServer:
    def __init__(
        self,
        console: Console,
        port: int = 8765,
        console_secrets: ConsoleSecrets | None = None,
        announce: Callable[[str], None] = print_new_link,
    ) -> None:
        self.secrets = console_secrets or ConsoleSecrets()
        # Bound before the app is made: port 0 picks a free one, and the app must know which.
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((LOOPBACK, port))
        self.port = self.socket.getsockname()[1]
        app = create_app(console, self.secrets, self.port, announce)
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The URL with the token: the one line the operator opens."""
        return self.secrets.url(self.port)

    @property
    def origin(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def serve(self) -> None:
        self.server.run(sockets=[self.socket])

    def start(self, timeout: float = 15) -> ConsoleServer:
        self._thread = threading.Thread(target=self.serve, name="relevo-console", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the console server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.socket.close()

    def __enter__(self) -> ConsoleServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
