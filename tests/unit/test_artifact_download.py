"""`relevo artifacts get` on its own: a file served on loopback as a presigned link would be,
checked against its recorded sha256 and size, written as any file the user makes."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from relevo_cli.artifacts import ChecksumMismatch, download

BODY = b"hello from the build\n"


@contextmanager
def _served(body: bytes) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hello.txt"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _link(url: str, body: bytes = BODY) -> dict:
    return {"url": url, "name": "hello.txt", "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}


@pytest.mark.parametrize(
    "mask, mode",
    [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)],
    ids=["umask-022", "umask-077", "umask-002"],
)
def test_a_downloaded_artifact_gets_the_mode_the_umask_gives(tmp_path: Path, mask: int, mode: int):
    # Given the user's umask, as `touch` or `curl -o` would honour it
    with _served(BODY) as url, _umask(mask):
        # When the artifact is downloaded and verified
        path = download(_link(url), tmp_path / "hello.txt")
    # Then it holds the bytes, with the mode any file the user makes gets (not mkstemp's 0600)
    assert path.read_bytes() == BODY
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_a_download_that_does_not_match_its_record_leaves_nothing(tmp_path: Path):
    with _served(b"tampered\n") as url:
        with pytest.raises(ChecksumMismatch):
            download(_link(url), tmp_path / "hello.txt")
    assert list(tmp_path.iterdir()) == []
