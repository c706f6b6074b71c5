"""One `relevo local up` per state dir: it holds an exclusive lock on DIR/local-up.lock for as long
as it runs, and writes into that file who it is (pid, start time, then its URLs once ready).

The lock is an flock: the kernel drops it when the process ends however it ends, so a crashed
stack never blocks the next one. Whether a stack is up is asked the same way, by trying the lock
(never by the pid alone, which a zombie or a reused pid would fake). The file is never deleted:
deleting a lock file lets two processes lock two different files of the same name.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

LOCK_NAME = "local-up.lock"
# How long `up` keeps trying a lock that a `status` or `down` may be probing at that instant.
_ACQUIRE_PATIENCE_SEC = 1.0


@dataclass(frozen=True)
class Holder:
    """What the running stack wrote into the lock file."""

    pid: int
    started_at: str
    api_url: str | None = None
    aws_endpoint: str | None = None

    @property
    def uptime_sec(self) -> float:
        return (datetime.now(UTC) - datetime.fromisoformat(self.started_at)).total_seconds()


class AlreadyRunning(Exception):
    def __init__(self, state_dir: Path, holder: Holder | None) -> None:
        self.state_dir = state_dir
        self.holder = holder
        if holder is None:
            message = f"a local stack is already running on {state_dir} (it is starting)"
        else:
            where = f", API {holder.api_url}" if holder.api_url else " (still starting)"
            message = f"a local stack is already running on {state_dir}: pid {holder.pid}{where}"
        super().__init__(f"{message}; `relevo local status` shows it, `relevo local down` stops it")


def try_lock(path: Path) -> int | None:
    """An open descriptor of `path` holding its exclusive flock, or None when another process
    holds it. The file is created if need be."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _read(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None
    return Holder(**data) if isinstance(data, dict) else None


class StateDirLock:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and write this process into it, or raise AlreadyRunning naming the holder."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + _ACQUIRE_PATIENCE_SEC
        while (fd := try_lock(self.path)) is None:
            if time.monotonic() >= deadline:
                raise AlreadyRunning(self.state_dir, _read(self.path))
            time.sleep(0.05)
        self._fd = fd
        self._write(Holder(pid=os.getpid(), started_at=datetime.now(UTC).isoformat()))

    def publish(self, api_url: str, aws_endpoint: str | None) -> None:
        """Add the stack's URLs once it is ready."""
        holder = _read(self.path)
        assert holder is not None and holder.pid == os.getpid(), "publish() needs the lock"
        self._write(Holder(holder.pid, holder.started_at, api_url, aws_endpoint))

    def hold_until_exit(self) -> None:
        """Keep the lock until this process exits, however it exits (the kernel drops it then):
        whoever waits for the stack to stop waits for the process, not for its last cleanup step."""
        assert self._fd is not None, "hold_until_exit() needs the lock"

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # nobody holds it now: readers find it empty
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    def _write(self, holder: Holder) -> None:
        assert self._fd is not None
        data = json.dumps(asdict(holder)).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)


def running(state_dir: Path) -> Holder | None:
    """The stack holding the state dir's lock, or None when no stack runs there."""
    path = state_dir / LOCK_NAME
    if not path.exists():
        return None
    fd = try_lock(path)
    if fd is None:
        # Held. Empty only between the holder's flock and its first write: pid 0, "starting".
        return _read(path) or Holder(pid=0, started_at=datetime.now(UTC).isoformat())
    os.close(fd)  # free: whatever the file says was written by a stack that has ended
    return None
