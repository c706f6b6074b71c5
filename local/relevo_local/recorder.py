"""A local HTTP server on loopback standing in for GitHub, GitLab or Slack (never for AWS), for
the tests and the demo: it records every request and answers what was scripted: 201 by default,
a queue of answers (500, 429 with Retry-After, 403 with rate-limit headers), or a hang."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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


class Recorder:
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
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="http-recorder")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def answer(
        self, status: int, headers: dict[str, str] | None = None, body: bytes = b"{}", times: int = 1
    ) -> None:
        """The next `times` requests get this answer (then 201 again)."""
        with self._lock:
            self._answers.extend(Answer(status, dict(headers or {}), body) for _ in range(times))

    def route(self, method: str, path_part: str, status: int, body: Any) -> None:
        """Every `method` request whose path holds `path_part` gets this answer (after any queued ones)."""
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
