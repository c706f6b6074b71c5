"""A local HTTP server on loopback standing in for GitHub, GitLab or Slack (never for AWS), for
the tests and the demo: it records every request and answers what was scripted: 201 by default,
a queue of answers (500, 429 with Retry-After, 403 with rate-limit headers), or a hang.

The server runs in a process of its own (`python -m relevo_local.recorder`), driven over a socket
pair. In a test worker the local stack's moto server shares the worker's process; a recorder
thread beside it waited for the interpreter's lock while moto served the stack's functions, and on
a loaded 2-core CI host it answered a status report after the reporter's 3 s read timeout (a
BrokenPipeError in the recorder, an attempt with no HTTP status in the report). In its own process
it answers from its own interpreter; if the process that started it dies, it sees its control
socket close and exits."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from typing import Any

# How long the recorder's process may take to start and say its port, and to stop.
START_TIMEOUT_SEC = 60.0
STOP_TIMEOUT_SEC = 10.0


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass
class Answer:
    status: int = 201
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"{}"
    hang_sec: float = 0.0


class RecorderServer:
    """The recording HTTP server itself, in the process that serves it."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._answers: list[Answer] = []
        self._lock = threading.Lock()
        self._hang_all = 0.0
        self._routes: list[tuple[str, str, Answer]] = []
        self._stopping = threading.Event()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                answer = recorder._next(self.command, self.path)
                with recorder._lock:
                    recorder.requests.append(
                        Recorded(
                            self.command,
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            time.time(),
                        )
                    )
                if answer.hang_sec:
                    recorder._stopping.wait(answer.hang_sec)
                    return  # the client timed out long ago; answer nothing
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            do_PATCH = do_POST  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            daemon=True,
            name="http-recorder",
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> RecorderServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def answer(
        self, status: int, headers: dict[str, str] | None = None, body: bytes = b"{}", times: int = 1
    ) -> None:
        with self._lock:
            self._answers.extend(Answer(status, dict(headers or {}), body) for _ in range(times))

    def route(self, method: str, path_part: str, status: int, body: Any) -> None:
        with self._lock:
            self._routes.append((method, path_part, Answer(status, {}, json.dumps(body).encode())))

    def hang(self, seconds: float, times: int = 1) -> None:
        with self._lock:
            self._answers.extend(Answer(hang_sec=seconds) for _ in range(times))

    def hang_always(self, seconds: float) -> None:
        self._hang_all = seconds

    def _next(self, method: str, path: str) -> Answer:
        with self._lock:
            if self._answers:
                return self._answers.pop(0)
            for routed_method, part, answer in self._routes:
                if routed_method == method and part in path:
                    return answer
        return Answer(hang_sec=self._hang_all) if self._hang_all else Answer()

    def received(self, path_part: str = "") -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if path_part in r.path]


# What the controlling process may ask of the server's process.
_COMMANDS = ("answer", "route", "hang", "hang_always", "received")


class Recorder:
    """The recorder as the tests and the demo hold it: its server runs in a process of its own."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._control: Connection | None = None
        self._lock = threading.Lock()  # one command and its answer at a time on the socket
        self._url = ""

    @property
    def url(self) -> str:
        return self._url

    @property
    def requests(self) -> list[Recorded]:
        return self.received()

    def start(self) -> Recorder:
        ours, theirs = socket.socketpair()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "relevo_local.recorder", "--control-fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self._control = Connection(ours.detach())
        if not self._control.poll(START_TIMEOUT_SEC):
            self.stop()
            raise RuntimeError(f"the recorder's process said no port within {START_TIMEOUT_SEC:.0f} s")
        self._url = self._control.recv()
        return self

    def stop(self) -> None:
        if self._control is not None:
            try:
                with self._lock:
                    self._control.send(("stop", (), {}))
                    if self._control.poll(STOP_TIMEOUT_SEC):
                        self._control.recv()
            except (OSError, EOFError):
                pass  # it has already gone
            self._control.close()
            self._control = None
        if self._process is not None:
            try:
                self._process.wait(STOP_TIMEOUT_SEC)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def _call(self, command: str, *args: Any, **kwargs: Any) -> Any:
        if self._control is None:
            raise RuntimeError("the recorder is not running")
        with self._lock:
            self._control.send((command, args, kwargs))
            ok, value = self._control.recv()
        if not ok:
            raise RuntimeError(f"the recorder's {command} failed: {value}")
        return value

    def answer(
        self, status: int, headers: dict[str, str] | None = None, body: bytes = b"{}", times: int = 1
    ) -> None:
        """The next `times` requests get this answer (then 201 again)."""
        self._call("answer", status, headers, body, times)

    def route(self, method: str, path_part: str, status: int, body: Any) -> None:
        """Every `method` request whose path holds `path_part` gets this answer (after any queued ones)."""
        self._call("route", method, path_part, status, body)

    def hang(self, seconds: float, times: int = 1) -> None:
        self._call("hang", seconds, times)

    def hang_always(self, seconds: float) -> None:
        self._call("hang_always", seconds)

    def received(self, path_part: str = "") -> list[Recorded]:
        found: list[Recorded] = self._call("received", path_part)
        return found


def serve(control: Connection) -> None:
    """The recorder's process: serve HTTP, and do what the control socket asks until it says stop
    or closes (the process that started it has gone)."""
    server = RecorderServer().start()
    control.send(server.url)
    try:
        while True:
            try:
                command, args, kwargs = control.recv()
            except (EOFError, OSError):
                return
            if command == "stop":
                control.send((True, None))
                return
            if command not in _COMMANDS:
                control.send((False, f"unknown command {command!r}"))
                continue
            try:
                control.send((True, getattr(server, command)(*args, **kwargs)))
            except Exception as exc:  # noqa: BLE001 (said to the caller, which raises it)
                control.send((False, repr(exc)))
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m relevo_local.recorder")
    parser.add_argument("--control-fd", type=int, required=True)
    serve(Connection(parser.parse_args(argv).control_fd))


if __name__ == "__main__":
    # Through the package's module, so that what is sent back pickles as relevo_local.recorder's
    # Recorded, not __main__'s.
    from relevo_local import recorder

    recorder.main()
