"""Runs one stage command: `bash -c` in the project workspace, in its own process group, with
SIGTERM then SIGKILL to the whole group on timeout or cancel, and beside it a dead-man supervisor
process (relevo_agent/supervisor.py) that kills the group if this agent freezes or dies. With a
build user (`run_as`), the command is that user's and so is the workspace; the supervisor stays
the agent's (relevo_agent.build_user)."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relevo_agent.build_user import BuildUser
from relevo_agent.lease import Lease
from relevo_agent.stage_env import as_build_user

# The end of a command's output kept in its result (classification, probe evidence).
TAIL_BYTES = 4096

# How much lower than the agent's the priority of a stage's command (and of every process it
# starts) is: a build that keeps every core busy (xcodebuild) leaves the agent's lease keeper and
# claims the CPU they need, so a renewal is not starved into a fence (nice(1): the increment is
# inherited by the command's children; an unprivileged process can lower its priority, never
# raise it back). The agent keeps launchd's default priority (ProcessType Standard: a
# "Background" job would be throttled; a negative Nice is only honoured for a daemon run as root,
# launchd.plist(5)), so the build sits below it whichever way the agent was started.
BUILD_NICE = 10
_NICE = shutil.which("nice") or "/usr/bin/nice"


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    timed_out: bool
    canceled: bool
    output_tail: str
    duration_sec: float
    ended_at: float = 0.0  # monotonic: when the command was seen to end (a fence after it does not undo it)

    @property
    def signaled(self) -> int | None:
        """The signal that ended the command, when one did (Popen's negative return code)."""
        return -self.exit_code if self.exit_code < 0 else None


def _kill_group(process: subprocess.Popen[bytes], grace_sec: float) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=grace_sec)
    except subprocess.TimeoutExpired:
        pass
    try:
        # Grandchildren may outlive the leader: kill whatever is left of the group.
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# The supervisor learns the command's process group from the command itself: a wrapper writes its
# own pid (which leads a new session, hence the group) to the supervisor's pipe, closes its copy
# of the pipe and only then execs the command, keeping the pid. Until that line is written
# the wrapper holds the pipe open, so an agent that dies at any moment still leaves the supervisor
# a group to kill.
def _announcing(fd: int) -> str:
    return f'echo "group $$" >&{fd}; exec {fd}>&-; exec bash -c "$1"'


_SUPERVISOR = Path(__file__).with_name("supervisor.py")


class Supervisor:
    """The dead-man supervisor process of one command (relevo_agent/supervisor.py): it kills the
    command's group when the lease's fence passes without an extension, or when this process
    dies. Every extension of the lease is passed on to it."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        read_end, self._write_end = os.pipe()
        self._lock = threading.Lock()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_SUPERVISOR)],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                # Outside the stage's group and the agent's: SIGSTOP of the agent leaves it running.
                start_new_session=True,
            )
        finally:
            os.close(read_end)
        self._send(self._fence_line(lease))
        self._unwatch = lease.watch(lambda renewed: self._send(self._fence_line(renewed)))

    @property
    def pipe(self) -> int:
        """The write end the command's wrapper announces its group on (inherited by it)."""
        return self._write_end

    @staticmethod
    def _fence_line(lease: Lease) -> str:
        return f"fence {max(0.0, lease.fence_in()):.3f} {lease.grace_sec:.3f}\n"

    def _send(self, line: str) -> None:
        with self._lock:
            if self._write_end < 0:
                return
            try:
                os.write(self._write_end, line.encode())
            except OSError:  # it already killed the group and exited
                pass

    def done(self) -> None:
        """The command ended here: the supervisor exits without killing anything."""
        self._unwatch()
        self._send("done\n")
        with self._lock:
            os.close(self._write_end)
            self._write_end = -1
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def run_command(
    command: str,
    workspace: Path,
    env: dict[str, str],
    timeout_sec: float,
    cancel: threading.Event,
    on_output: Callable[[bytes], None],
    grace_sec: float = 10.0,
    tail_bytes: int = TAIL_BYTES,
    lease: Lease | None = None,
    stop_grace_sec: Callable[[], float] | None = None,
    on_start: Callable[[int], None] | None = None,
    user: BuildUser | None = None,
) -> ExecResult:
    """Run `command` to its end, its timeout or `cancel` (SIGTERM to the group, SIGKILL after
    `stop_grace_sec()` if given, else `grace_sec`). With a `lease`, a dead-man supervisor process
    also kills the group (SIGTERM, then SIGKILL after the lease's fence grace) when the lease's
    fence passes without an extension, or when this process dies meanwhile. With `user`, the
    workspace is handed to that user and the command runs as it."""
    workspace.mkdir(parents=True, exist_ok=True)
    spawn: dict[str, Any] = {}
    if user is not None:
        user.hand_over(workspace)
        env = as_build_user(env, user)
        spawn = user.popen()
    supervisor = Supervisor(lease) if lease is not None else None
    started = time.monotonic()
    try:
        if supervisor is None:
            process = _spawn(["bash", "-c", command], workspace, env, (), spawn)
        else:
            fd = supervisor.pipe
            process = _spawn(
                ["bash", "-c", _announcing(fd), "relevo-stage", command], workspace, env, (fd,), spawn
            )
    except BaseException:
        if supervisor is not None:
            supervisor.done()
        raise
    if on_start is not None:
        on_start(process.pid)  # the leader of a new session: its pid is the group's id
    tail = bytearray()

    def pump() -> None:
        stdout = process.stdout
        assert isinstance(stdout, io.BufferedReader)  # Popen's pipe in binary mode, buffered
        for chunk in iter(lambda: stdout.read1(65536), b""):
            on_output(chunk)
            tail.extend(chunk)
            del tail[:-tail_bytes]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = canceled = False
    deadline = started + timeout_sec
    while process.poll() is None:
        if cancel.is_set():
            canceled = True
            _kill_group(process, stop_grace_sec() if stop_grace_sec else grace_sec)
            break
        if time.monotonic() >= deadline:
            timed_out = True
            _kill_group(process, grace_sec)
            break
        try:
            process.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
    exit_code = process.wait()
    # Background children the command left behind die with the stage, not after it.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    ended = time.monotonic()
    reader.join(timeout=2)
    if supervisor is not None:
        supervisor.done()
    return ExecResult(
        exit_code=exit_code,
        timed_out=timed_out,
        canceled=canceled,
        output_tail=tail.decode("utf-8", "replace"),
        duration_sec=ended - started,
        ended_at=ended,
    )


def _spawn(
    argv: list[str], workspace: Path, env: dict[str, str], pass_fds: tuple[int, ...], as_user: dict[str, Any]
) -> subprocess.Popen[bytes]:
    # nice(1) execs the command in its place: the pid (the group's leader, which the wrapper
    # announces) stays the same.
    return subprocess.Popen(
        [_NICE, "-n", str(BUILD_NICE), *argv],
        cwd=workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        pass_fds=pass_fds,
        start_new_session=True,  # its own session, hence its own process group
        **as_user,
    )
