"""A git server over plain HTTP on loopback, for checkouts with credentials: git's own
`git http-backend` (the smart HTTP protocol, as GitHub and GitLab speak it) behind HTTP Basic
authentication that takes one username and password, 401 otherwise, like a forge refusing a token.
Every request's Authorization header is kept, so a test can see what git sent."""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BACKEND = next(
    (
        p
        for p in (
            "/usr/lib/git-core/git-http-backend",
            "/usr/libexec/git-core/git-http-backend",
            "/Library/Developer/CommandLineTools/usr/libexec/git-core/git-http-backend",
        )
        if Path(p).exists()
    ),
    None,
)


class GitHttpServer:
    def __init__(self, root: Path, username: str, password: str) -> None:
        self.root, self.expected = (
            root,
            "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode(),
        )
        self.authorizations: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                given = self.headers.get("Authorization")
                server.authorizations.append(given or "")
                if given != server.expected:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="forge"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path, _, query = self.path.partition("?")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                env = {
                    "GIT_PROJECT_ROOT": str(server.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "REQUEST_METHOD": self.command,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "REMOTE_USER": "ci",
                    "REMOTE_ADDR": "127.0.0.1",
                    "GATEWAY_INTERFACE": "CGI/1.1",
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                }
                out = subprocess.run([BACKEND], input=body, env=env, capture_output=True, check=False).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                status, headers = 200, []
                for line in head.decode().splitlines():
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> GitHttpServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
