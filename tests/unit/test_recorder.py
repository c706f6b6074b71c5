"""The loopback recorder that stands in for GitHub, GitLab and Slack answers from a process of its
own: a test worker's process also runs the local stack's moto server, and a recorder thread in it
answered after the status reporter's read timeout on a loaded CI host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.helpers.processes import is_dead
from tests.helpers.recorder import Recorder
from tests.helpers.stack import wait_until


def test_the_recorder_answers_while_the_process_that_started_it_is_frozen():
    recorder = Recorder().start()
    try:
        recorder.answer(429, headers={"Retry-After": "1"})
        # A client in another process freezes this one (as a starved worker is, for the
        # recorder's purposes), asks the recorder with a 2 s read timeout, then thaws it.
        client = f"""
import os, signal, urllib3
os.kill({os.getpid()}, signal.SIGSTOP)
try:
    answer = urllib3.PoolManager().request(
        "POST", "{recorder.url}/repos/acme/app/statuses/abc", body=b'{{"state": "pending"}}',
        timeout=urllib3.Timeout(connect=2.0, read=2.0), retries=False,
    )
    print(answer.status, answer.headers.get("Retry-After"))
except Exception as exc:
    print(type(exc).__name__)
finally:
    os.kill({os.getpid()}, signal.SIGCONT)
"""
        done = subprocess.run([sys.executable, "-c", client], capture_output=True, text=True, timeout=60)
        assert done.stdout.split() == ["429", "1"], done.stdout + done.stderr
        [request] = recorder.received("/statuses/abc")
        assert (request.method, request.json()) == ("POST", {"state": "pending"})
        assert recorder.requests == [request]
    finally:
        recorder.stop()


def test_the_recorders_process_ends_with_its_stop_and_with_the_process_that_started_it():
    recorder = Recorder().start()
    server = recorder._process
    assert server is not None
    recorder.stop()
    assert server.poll() is not None

    # Started by a process that is then killed: it sees its control socket close and exits.
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from relevo_local.recorder import Recorder; r = Recorder().start(); "
            "print(r._process.pid, flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    orphan = int(owner.stdout.readline())
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    wait_until(
        lambda: is_dead(orphan), 30, f"the recorder's process {orphan} gone after the one that started it"
    )
