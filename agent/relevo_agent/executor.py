"""Runs one stage command: `bash -c` in the project workspace, in its own process group, with
SIGTERM then SIGKILL to the whole group on timeout or cancel."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# The end of a command's output kept in its result (classification, probe evidence).
TAIL_BYTES = 4096


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    timed_out: bool
    canceled: bool
    output_tail: str
    duration_sec: float


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


# Kills the stage's process group if the agent dies: it waits on a pipe only the agent holds, and
# the kernel closes that pipe when the agent exits for any reason (SIGKILL included). It starts
# before the stage and learns the group from the pipe's first line, so there is no moment when the
# stage runs unwatched; a normal end writes a second line, which lets it exit without killing.
_WATCHDOG = 'read -r pg || exit 0; read -r _ && exit 0; kill -TERM -- "-$pg" 2>/dev/null; sleep "$1"; kill -KILL -- "-$pg" 2>/dev/null; exit 0'


def _start_watchdog(grace_sec: float) -> tuple[subprocess.Popen[bytes], int]:
    read_end, write_end = os.pipe()
    try:
        watchdog = subprocess.Popen(
            ["bash", "-c", _WATCHDOG, "relevo-watchdog", str(grace_sec)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # outside the stage's group and the agent's
        )
    finally:
        os.close(read_end)
    return watchdog, write_end


def _stop_watchdog(watchdog: subprocess.Popen[bytes], write_end: int) -> None:
    try:
        os.write(write_end, b"done\n")
    except OSError:
        pass
    os.close(write_end)
    try:
        watchdog.wait(timeout=5)
    except subprocess.TimeoutExpired:
        watchdog.kill()


def run_command(
    command: str,
    workspace: Path,
    env: dict[str, str],
    timeout_sec: float,
    cancel: threading.Event,
    on_output: Callable[[bytes], None],
    grace_sec: float = 10.0,
    tail_bytes: int = TAIL_BYTES,
    watchdog: bool = False,
) -> ExecResult:
    """Run `command` to its end, its timeout or `cancel`. With `watchdog`, the process group is
    also killed (SIGTERM, then SIGKILL after the grace) if this process dies meanwhile."""
    workspace.mkdir(parents=True, exist_ok=True)
    guard = _start_watchdog(grace_sec) if watchdog else None
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=workspace,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own session, hence its own process group
        )
    except BaseException:
        if guard is not None:
            os.close(guard[1])  # EOF before a group: the watchdog exits
            guard[0].wait()
        raise
    if guard is not None:
        os.write(guard[1], f"{process.pid}\n".encode())
    tail = bytearray()

    def pump() -> None:
        assert process.stdout is not None
        for chunk in iter(lambda: process.stdout.read1(65536), b""):  # type: ignore[union-attr]
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
            _kill_group(process, grace_sec)
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
    reader.join(timeout=2)
    if guard is not None:
        _stop_watchdog(*guard)
    return ExecResult(
        exit_code=exit_code,
        timed_out=timed_out,
        canceled=canceled,
        output_tail=tail.decode("utf-8", "replace"),
        duration_sec=time.monotonic() - started,
    )
