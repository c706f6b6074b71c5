"""A checkout never hangs: a remote that takes the connection and never answers (a partition
that holds the socket, a frozen server) is cut at the deadline, on the agent's monotonic clock,
and the git processes are gone (their process group is killed).

Checkouts that hang with no bound are a known trap (Buildkite's --git-checkout-timeout defaults to
0); git itself has no default timeout for an HTTP remote that stops talking.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relevo_agent.checkout import checkout
from relevo_agent.git_commands import CheckoutFailure, Git
from relevo_core.models.checkout_plan import CheckoutPlan
from relevo_core.models.errors import ErrorClass


@pytest.fixture()
def silent_remote() -> Iterator[str]:
    """An HTTP "server" that accepts every connection and never sends a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/app.git"
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()


def _git_processes_naming(url: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if url in command and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def test_a_remote_that_never_answers_fails_the_checkout_at_the_stages_deadline(tmp_path, silent_remote):
    plan = CheckoutPlan(url=silent_remote, timeout_sec=900)
    started = time.monotonic()
    with pytest.raises(CheckoutFailure) as failure:
        checkout(
            plan,
            tmp_path / "root",
            tmp_path / "root" / "app",
            "main",
            None,
            lambda commit: commit,
            deadline=started + 1.0,
            cancel=threading.Event(),
            emit=lambda line: None,
        )
    took = time.monotonic() - started
    assert failure.value.error_class is ErrorClass.NETWORK_TIMEOUT, failure.value
    assert "did not finish in time" in str(failure.value)
    # The bound is the deadline, plus the poll and the kill (SIGTERM, then SIGKILL after 2 s).
    assert took < 1.0 + 3.0, took
    assert _git_processes_naming(silent_remote) == []


def test_a_fetch_is_cut_at_its_own_limit_when_the_stage_has_time_left(tmp_path, silent_remote):
    git = Git(deadline=time.monotonic() + 3600, cancel=threading.Event())
    mirror = tmp_path / "mirror.git"
    git.run(["init", "--quiet", "--bare", str(mirror)])
    git.run(["-C", str(mirror), "remote", "add", "origin", silent_remote])
    started = time.monotonic()
    with pytest.raises(CheckoutFailure) as failure:
        git.run(
            ["-C", str(mirror), "fetch", "--quiet", "origin", "+refs/heads/*:refs/heads/*"],
            limit=1.0,
            what="fetch",
        )
    assert failure.value.error_class is ErrorClass.NETWORK_TIMEOUT
    assert time.monotonic() - started < 1.0 + 3.0
    assert _git_processes_naming(silent_remote) == []
