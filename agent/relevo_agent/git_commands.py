"""git commands of a stage's checkout (relevo_agent.checkout), each bounded: its process group is
killed at the deadline (the checkout's timeout_sec or the stage's exec deadline, whichever comes
first, on this process's monotonic clock) or when the stage is stopped, whichever comes first; and
the lock the agents of one Mac share a mirror under. What they fail with is classified here:
retrying cannot help (Relevo.Fatal.Checkout), or it may (a network failure or timeout).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from relevo_agent.build_user import BuildUser
from relevo_agent.stage_env import as_build_user, without_agent_credentials
from relevo_core.models.errors import ErrorClass

# What git prints when retrying cannot help (checked first) and when the network failed.
_REFUSED = (
    "authentication failed",
    "permission denied",
    "could not read username",
    "could not read password",
    "invalid username or password",
    "repository not found",
    "does not appear to be a git repository",
    "the requested url returned error: 401",
    "the requested url returned error: 403",
    "the requested url returned error: 404",
    "host key verification failed",
    "couldn't find remote ref",
    "not our ref",
    "no such remote",
    "access denied",
    "not a git repository",
)


class CheckoutFailure(Exception):
    def __init__(self, error_class: ErrorClass, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


class CheckoutStopped(Exception):
    """The stage was stopped (fenced, canceled) while a git command ran: it was killed."""


def classify(stderr: str) -> ErrorClass:
    lowered = stderr.lower()
    if any(sign in lowered for sign in _REFUSED):
        return ErrorClass.CHECKOUT_FAILED
    return ErrorClass.CONNECTION_RESET


class Git:
    """git commands of one stage's checkout, each killed (its process group) at the deadline or
    when the stage is stopped, whichever comes first."""

    # Every command: no prompt, no credential helper of the Mac's configuration, no hooks.
    CONFIG = (
        "-c",
        "credential.helper=",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "protocol.file.allow=always",
        "-c",
        "advice.detachedHead=false",
    )

    def __init__(
        self,
        deadline: float,
        cancel: threading.Event,
        masked: list[str] | None = None,
        user: BuildUser | None = None,
    ) -> None:
        self.deadline, self.cancel = deadline, cancel
        self.masked = masked or []
        base = without_agent_credentials(os.environ)
        self.env = {**base, "GIT_TERMINAL_PROMPT": "0", "GIT_LFS_SKIP_SMUDGE": "1", "LC_ALL": "C"}
        # With a build user, every command runs as it (the workspace's git: relevo_agent.build_user).
        self.spawn: dict[str, Any] = {}
        if user is not None:
            self.env = as_build_user(self.env, user)
            self.spawn = user.popen()

    def mask(self, text: str) -> str:
        for value in self.masked:
            text = text.replace(value, "******")
        return text

    def run(
        self,
        args: list[str],
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        limit: float | None = None,
        check: bool = True,
        what: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        deadline = self.deadline if limit is None else min(self.deadline, time.monotonic() + limit)
        process = subprocess.Popen(
            ["git", *self.CONFIG, *args],
            cwd=cwd,
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            **self.spawn,
        )
        while True:
            try:
                out, err = process.communicate(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if self.cancel.is_set() or time.monotonic() >= deadline:
                    _kill(process)
                    process.communicate()
                    if self.cancel.is_set():
                        raise CheckoutStopped() from None
                    raise CheckoutFailure(
                        ErrorClass.NETWORK_TIMEOUT,
                        f"checkout: `git {what or args[0]}` did not finish in time (checkout.timeout_sec or "
                        "the stage's exec timeout); killed",
                    ) from None
        done = subprocess.CompletedProcess(args, process.returncode, out, err)
        if check and done.returncode != 0:
            message = self.mask(err.strip() or out.strip())[-1500:]
            raise CheckoutFailure(
                classify(message),
                f"checkout: `git {what or args[0]}` failed (exit {done.returncode}): {message}",
            )
        return done


def _kill(process: subprocess.Popen[str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=2)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def locked(path: Path, deadline: float, cancel: threading.Event) -> Iterator[None]:
    """flock(2) on `path`, waited for at most until the deadline: the agents of one Mac share a mirror."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancel.is_set():
                    raise CheckoutStopped() from None
                if time.monotonic() >= deadline:
                    raise CheckoutFailure(
                        ErrorClass.NETWORK_TIMEOUT,
                        f"checkout: the mirror {path.stem} stayed locked by another agent of this Mac",
                    ) from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)
