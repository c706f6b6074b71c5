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


def run_command(
    command: str,
    workspace: Path,
    env: dict[str, str],
    timeout_sec: float,
    cancel: threading.Event,
    on_output: Callable[[bytes], None],
    grace_sec: float = 10.0,
    tail_bytes: int = 4096,
) -> ExecResult:
    workspace.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    process = subprocess.Popen(
        ["bash", "-c", command],
        cwd=workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own session, hence its own process group
    )
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
    return ExecResult(
        exit_code=exit_code,
        timed_out=timed_out,
        canceled=canceled,
        output_tail=tail.decode("utf-8", "replace"),
        duration_sec=time.monotonic() - started,
    )
