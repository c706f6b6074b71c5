"""`relevo local down` says "stopped" only once the stack's process is gone. `relevo local up` runs
as a process of its own here, with the emulator left out (its LocalStack stands in, started and
stopped at once) and an exit that lingers until the test lets it end, as the real one's does after
its stack stopped (seconds of interpreter teardown): while that process lingers, the state dir
still says a stack runs there, so `down` waits. No timing: the test waits for the process to say
it lingers, looks, then lets it go. (The same commands with the real emulator:
tests/e2e/test_local_stack_commands.py.)"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_cli.main import app
from relevo_local.state_dir import running

runner = CliRunner()

# `relevo local up` with a LocalStack that starts and stops at once; once its stack stopped, the
# process says so on stdout and lingers until its stdin closes.
UP = """
import atexit, sys
from relevo_core.files.stack import StackInfo
import relevo_local.stack

class LocalStack:
    def __init__(self, state_dir, parameters, api_port):
        self.state_dir = state_dir
    def start(self):
        info = StackInfo(api_url="http://127.0.0.1:9/v1", aws_endpoint="http://127.0.0.1:9",
                         region="us-east-1",
                         resources={}, work_queues={"eu-west": "http://127.0.0.1:9/q"})
        (self.state_dir / "stack.json").write_text(info.model_dump_json())
        return info
    def stop(self):
        atexit.register(lambda: (print("lingering", flush=True), sys.stdin.read()))

relevo_local.stack.LocalStack = LocalStack
from relevo_cli.main import app
sys.argv = ["relevo", "local", "up", "--state-dir", sys.argv[1]]
app()
"""


def _wait_for(condition, what: str, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_down_says_stopped_only_once_the_stacks_process_has_exited(tmp_path: Path):
    # Given `relevo local up` running on a state dir
    state_dir = tmp_path / "state"
    up = subprocess.Popen(
        [sys.executable, "-c", UP, str(state_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        _wait_for(
            lambda: (holder := running(state_dir)) is not None and holder.api_url is not None,
            "the stack ready",
        )

        # When `relevo local down` stops it, and its process lingers after its stack stopped
        said: list[str] = []
        down = threading.Thread(
            target=lambda: said.append(
                runner.invoke(app, ["local", "down", "--state-dir", str(state_dir)]).output
            )
        )
        down.start()
        lines = []
        _wait_for(
            lambda: lines.append(up.stdout.readline()) or "lingering\n" in lines,
            "the process lingering after its stack stopped",
        )

        # Then while the process is there, the state dir still says a stack runs there, and down has said
        # nothing
        assert up.poll() is None
        assert running(state_dir) is not None, "the state dir was given up before the process ended"
        assert said == []

        # And once the process ends, down says it stopped
        up.stdin.close()
        down.join(timeout=60)
        assert up.wait(timeout=60) == 0
        assert said and said[0].startswith(f"local stack on {state_dir} stopped (pid {up.pid}"), said
        assert running(state_dir) is None and not (state_dir / "stack.json").exists()
    finally:
        if up.poll() is None:
            up.kill()
