"""Start and stop the local stack and agents as real processes (used by the demo and e2e tests)."""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from relevo_core.files.private import write_private
from relevo_core.files.stack import StackInfo, load_stack
from relevo_local.state_dir import Holder, running


class ProcessFailed(RuntimeError):
    pass


def _stop(process: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def local_stack(
    state_dir: Path, log_file: Path, extra_args: list[str] | None = None, timeout: float = 120
) -> Iterator[StackInfo]:
    """`relevo local up` in a child process; yields once it holds the state dir and its stack.json
    is written (a stack.json another stack left there is never taken for this one's)."""
    stack_file = state_dir / "stack.json"
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relevo_cli.main",
                "local",
                "up",
                "--state-dir",
                str(state_dir),
                *(extra_args or []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while not _ready(running(state_dir), process.pid, stack_file):
            if process.poll() is not None:
                raise ProcessFailed(f"relevo local up exited with {process.returncode}; see {log_file}")
            if time.monotonic() > deadline:
                raise ProcessFailed(f"relevo local up not ready after {timeout}s; see {log_file}")
            time.sleep(0.1)
        yield load_stack(stack_file)
    finally:
        _stop(process)


def _ready(holder: Holder | None, pid: int, stack_file: Path) -> bool:
    return holder is not None and holder.pid == pid and holder.api_url is not None and stack_file.exists()


def write_agent_config(
    path: Path,
    stack_file: Path,
    region: str,
    agent_id: str,
    capacity: int = 1,
    poll_wait_sec: int = 20,
    max_clock_skew_sec: float = 1.0,
    **settings: int | float | str | dict[str, str],
) -> Path:
    """An agent TOML for the local stack; `settings` are further keys (presence_interval_sec,
    labels as a dict...).
    Agents of the local stack share this host's clock with it: a small allowed skew keeps the
    fence margin small (relevo_core.fleet.lease_timeline). Every path is written absolute (the agent
    reads relative ones relative to the file). The workspaces go beside the file, unless that is
    inside a git work tree (a state dir in your Relevo checkout): then under the user's cache, so
    that no stage's git ever acts on that repository."""
    path = path.resolve()
    workspace = local_workspace_root(path.parent, agent_id)
    write_private(
        path,
        "\n".join(
            [
                f'agent_id = "{agent_id}"',
                f'region = "{region}"',
                f"capacity = {capacity}",
                f'workspace_root = "{workspace}"',
                f'journal = "{path.parent / (agent_id + "-journal.sqlite3")}"',
                f'stack_file = "{stack_file.resolve()}"',
                f"poll_wait_sec = {poll_wait_sec}",
                # One host, one clock with the local stack; a Mac keeps the default, 5 s
                # (docs/agent-config.md, "On the local stack").
                "# this host's clock is the local stack's: a smaller allowed skew than a Mac's 5 s",
                f"max_clock_skew_sec = {max_clock_skew_sec}",
                *(f"{name} = {_toml_value(value)}" for name, value in settings.items()),
                "",
            ]
        ),
    )
    return path


@contextmanager
def agent_process(
    config: Path, log_file: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "relevo_agent.launch", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    try:
        yield process
    finally:
        _stop(process, timeout=30)


def _toml_value(value: int | float | str | dict[str, str]) -> str:
    import json

    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {json.dumps(item)}" for key, item in value.items()) + "}"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def local_workspace_root(home: Path, agent_id: str) -> Path:
    from relevo_agent.checkout import inside_git_work_tree

    if inside_git_work_tree(home) is None:
        return home / f"{agent_id}-workspaces"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:12]
    return cache / "relevo" / "local-workspaces" / digest / agent_id


def random_commit() -> str:
    return secrets.token_hex(20)
