"""The stage command runner: exit codes, output, timeouts, cancel, and killing the whole group."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from relevo_agent.executor import ExecResult, run_command
from tests.helpers.processes import is_dead, wait_until

BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}


def run(
    command: str,
    workspace: Path,
    *,
    env: dict[str, str] | None = None,
    timeout_sec: float = 20.0,
    cancel: threading.Event | None = None,
    grace_sec: float = 2.0,
    chunks: list[bytes] | None = None,
    tail_bytes: int = 4096,
) -> ExecResult:
    sink = chunks if chunks is not None else []
    return run_command(
        command,
        workspace=workspace,
        env={**BASE_ENV, **(env or {})},
        timeout_sec=timeout_sec,
        cancel=cancel or threading.Event(),
        on_output=sink.append,
        grace_sec=grace_sec,
        tail_bytes=tail_bytes,
    )


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def run_in_thread(**kwargs: Any) -> tuple[threading.Thread, dict[str, ExecResult]]:
    box: dict[str, ExecResult] = {}

    def target() -> None:
        box["result"] = run(**kwargs)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


@pytest.fixture
def reap_leftovers() -> Iterator[list[int]]:
    """Pids a test spawned indirectly; any still alive at the end are SIGKILLed so nothing leaks."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.parametrize("code", [0, 1, 2, 75, 255])
def test_exit_code_passes_through(tmp_path: Path, code: int) -> None:
    """Given a command that exits with a code, when run, then the result carries that code."""
    result = run(f"echo before; exit {code}", tmp_path)
    assert result.exit_code == code
    assert not result.timed_out and not result.canceled
    assert result.output_tail == "before\n"


def test_output_is_delivered_in_order(tmp_path: Path) -> None:
    """Given a command that prints many lines to stdout and stderr, when run, then on_output
    receives all of it, in order, and the tail holds the end."""
    chunks: list[bytes] = []
    result = run(
        "for i in $(seq 1 3000); do echo line-$i; if [ $((i % 500)) -eq 0 ]; then echo err-$i >&2; fi; done",
        tmp_path,
        chunks=chunks,
        tail_bytes=64,
    )
    assert result.exit_code == 0
    expected = []
    for i in range(1, 3001):
        expected.append(f"line-{i}\n")
        if i % 500 == 0:
            expected.append(f"err-{i}\n")
    output = b"".join(chunks).decode()
    assert output == "".join(expected)
    assert result.output_tail == output[-64:]


def test_non_utf8_output_does_not_break_the_tail(tmp_path: Path) -> None:
    """Given a command that prints invalid UTF-8, when run, then the raw bytes reach on_output and
    the tail is decoded with replacement characters."""
    chunks: list[bytes] = []
    result = run(r"printf 'ok \377\376 end'", tmp_path, chunks=chunks)
    assert b"".join(chunks) == b"ok \xff\xfe end"
    assert result.output_tail == "ok \ufffd\ufffd end"


def test_timeout_stops_a_long_command_quickly(tmp_path: Path) -> None:
    """Given `sleep 30` with a 0.5 s timeout, when run, then it returns timed_out within seconds."""
    started = time.monotonic()
    result = run("sleep 30", tmp_path, timeout_sec=0.5, grace_sec=2.0)
    elapsed = time.monotonic() - started
    assert result.timed_out
    assert not result.canceled
    assert result.exit_code != 0
    assert 0.4 <= elapsed < 5.0
    assert result.duration_sec < 5.0


def test_cancel_kills_the_whole_process_group_including_grandchildren(
    tmp_path: Path, reap_leftovers: list[int]
) -> None:
    """Given a command whose shell starts a background grandchild and waits, when the cancel Event
    is set, then run_command returns canceled and the grandchild is dead too."""
    cancel = threading.Event()
    thread, box = run_in_thread(
        command="bash -c 'sleep 300 & echo $! > child.pid; wait'",
        workspace=tmp_path,
        cancel=cancel,
        timeout_sec=60.0,
        grace_sec=2.0,
    )
    pid_file = tmp_path / "child.pid"
    assert wait_until(lambda: read_pid(pid_file) is not None), "the grandchild never wrote its pid"
    grandchild = read_pid(pid_file)
    assert grandchild is not None
    reap_leftovers.append(grandchild)
    assert not is_dead(grandchild)

    cancel.set()
    thread.join(timeout=10)
    assert not thread.is_alive(), "run_command did not return after cancel"
    result = box["result"]
    assert result.canceled and not result.timed_out
    assert result.exit_code != 0
    assert wait_until(lambda: is_dead(grandchild)), f"grandchild {grandchild} outlived the cancel"


def test_timeout_also_kills_grandchildren(tmp_path: Path, reap_leftovers: list[int]) -> None:
    """Given a command with a background grandchild, when the timeout fires, then the grandchild dies too."""
    result = run("sleep 300 & echo $! > child.pid; wait", tmp_path, timeout_sec=0.5, grace_sec=2.0)
    grandchild = read_pid(tmp_path / "child.pid")
    assert grandchild is not None
    reap_leftovers.append(grandchild)
    assert result.timed_out
    assert wait_until(lambda: is_dead(grandchild)), f"grandchild {grandchild} outlived the timeout"


def test_command_ignoring_sigterm_is_sigkilled_after_the_grace(tmp_path: Path) -> None:
    """Given a command that ignores SIGTERM, when it times out with grace_sec=0.3, then it is
    SIGKILLed shortly after the grace period."""
    started = time.monotonic()
    result = run("trap '' TERM; sleep 300", tmp_path, timeout_sec=0.5, grace_sec=0.3)
    elapsed = time.monotonic() - started
    assert result.timed_out
    assert result.exit_code == -signal.SIGKILL
    assert 0.7 <= elapsed < 5.0


def test_command_honouring_sigterm_exits_by_sigterm(tmp_path: Path) -> None:
    """Given a command that does not ignore SIGTERM, when canceled, then SIGTERM (not SIGKILL) ends
    it, without waiting for the grace period."""
    cancel = threading.Event()
    cancel.set()
    started = time.monotonic()
    result = run("sleep 300", tmp_path, cancel=cancel, grace_sec=10.0)
    assert result.canceled
    assert result.exit_code == -signal.SIGTERM
    assert time.monotonic() - started < 5.0


def test_env_vars_reach_the_command(tmp_path: Path) -> None:
    """Given env vars, when the command runs, then it sees them with their exact values."""
    result = run(
        'printf "%s|%s" "$RELEVO_JOB_ID" "$TRICKY"',
        tmp_path,
        env={"RELEVO_JOB_ID": "job_123", "TRICKY": "a b 'c' \"d\" $e ü"},
    )
    assert result.exit_code == 0
    assert result.output_tail == "job_123|a b 'c' \"d\" $e ü"


def test_cwd_is_the_workspace_and_is_created(tmp_path: Path) -> None:
    """Given a workspace that does not exist yet, when a command runs, then it is created and is
    the command's working directory."""
    workspace = tmp_path / "projects" / "demo"
    result = run("pwd -P; touch marker", workspace)
    assert result.exit_code == 0
    assert result.output_tail.strip() == str(workspace.resolve())
    assert (workspace / "marker").exists()


def test_stdin_is_closed(tmp_path: Path) -> None:
    """Given a command that reads stdin, when run, then it sees end of input instead of hanging."""
    result = run("cat; echo done", tmp_path, timeout_sec=5.0)
    assert not result.timed_out
    assert result.output_tail == "done\n"


def test_the_supervisor_kills_the_stage_group_when_the_agent_itself_is_killed(tmp_path: Path):
    import subprocess
    import sys

    pid_file, late = tmp_path / "pid", tmp_path / "late"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, threading, os, time\n"
            "from relevo_agent.executor import run_command\n"
            "from relevo_agent.lease import Lease\n"
            "from relevo_core.fleet.lease_timeline import LeaseTimeline\n"
            "lease = Lease(LeaseTimeline(3600, 1, 0), time.monotonic())\n"
            f"run_command('echo $$ > {pid_file}; sleep 5; touch {late}', pathlib.Path({str(tmp_path)!r}),"
            " {'PATH': os.environ['PATH']}, 60, threading.Event(), lambda chunk: None, grace_sec=1, "
            "lease=lease)\n",
        ]
    )
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    stage_pid = int(pid_file.read_text())

    agent.kill()  # SIGKILL: no handler, no cleanup in the agent
    agent.wait()

    deadline = time.monotonic() + 10  # grace 1 s, on a loaded machine
    while time.monotonic() < deadline:
        try:
            os.kill(stage_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the stage outlived its agent")
    assert not late.exists()
