"""What the scenarios of `make demo` share (see relevo_tools.demo): the fleet it starts, the demo's
API client, its story log, and the checks that decide whether a scenario held."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from relevo_cli.api import RelevoApi
from relevo_cli.commands.jobs import stage_words  # relevo job watch's words for a stage
from relevo_core.files.stack import StackInfo
from relevo_local.apple.provision import LocalApple

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = ROOT / "examples" / "demo"
# Piped or captured output (CI, a log file) gets a table-friendly width instead of rich's 80.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 140)

# Two agents in eu-west and us-east. us-east agents take two stages each, so the agent that should
# take a retry always has a free slot; eu-west agents take one, so the agent killed mid-upload runs
# nothing else. ap-south's three take one each: ui-tests' three shards run one a Mac.
FLEET = {
    "eu-west": ("mac-eu-1", "mac-eu-2"),
    "us-east": ("mac-us-1", "mac-us-2"),
    "ap-south": ("mac-ap-1", "mac-ap-2", "mac-ap-3"),
}
CAPACITY = {"eu-west": 1, "us-east": 2, "ap-south": 1}
# release-app's build and sign stages `require` these: the bundle travels from one Mac to the other.
# dep-cache's two stages `require` these: the job that restores the cache runs on another Mac than
# the job that saved it, whichever Mac placement would prefer.
LABELS = {
    "mac-eu-1": {"bay": "build"},
    "mac-eu-2": {"bay": "sign"},
    "mac-ap-1": {"deps": "a"},
    "mac-ap-2": {"deps": "b"},
}
# Short presence and hand-back intervals and a short long-poll keep the demo quick; nothing else
# is special-cased (see tests/e2e/test_agents_share_and_retry.py).
AGENT_SETTINGS: dict[str, int | float] = {
    "poll_wait_sec": 1,
    "presence_interval_sec": 2,
    "handoff_delay_sec": 1,
    "handoff_max_wait_sec": 60,
    "outbox_interval_sec": 0.5,
    # release-app's sign requires mac-eu-2; while it is busy (the kill scenario), look again soon.
    "requirement_recheck_sec": 2,
}
TERMINAL = ("succeeded", "failed", "canceled")
POLL_SEC = 1.0
TAG_STYLE = {
    "setup": "green",
    "fleet": "white",
    "release": "cyan",
    "retry": "magenta",
    "dlq": "yellow",
    "kill": "red",
    "shards": "blue",
    "caches": "bright_green",
}
_started = [time.monotonic()]


def restart_clock() -> None:
    _started[0] = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - _started[0]


def say(tag: str, message: str) -> None:
    """One line of the demo's story: seconds since the start, the scenario, what happened."""
    style = TAG_STYLE.get(tag, "white")
    console.print(f"[dim]{elapsed():6.1f}s[/dim] [{style}]{tag:<8}[/{style}] {message}", highlight=False)


class SerialApi(RelevoApi):
    """The demo's API client: one request at a time. The local API runs each function in warm
    processes and starts another one (a cold start) when all are busy, as Lambda scales out;
    four watchers polling side by side would make every function scale out for nothing."""

    lock = threading.Lock()

    def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        with self.lock:
            return super().request(method, path, body, params)


class NotHeld(Exception):
    """A scenario did not happen as expected; the message says what was seen instead."""


def expect(condition: Any, message: str) -> None:
    if not condition:
        raise NotHeld(message)


@dataclass
class ScenarioResult:
    scenario: str
    ok: bool
    evidence: list[str]


@dataclass
class Demo:
    stack: StackInfo
    stack_file: Path
    work: Path
    shared: Path  # RELEVO_DEMO_DIR of the stage commands: markers and effect files
    agents: dict[str, subprocess.Popen[bytes]]
    # Starts an agent of the fleet again, as launchd's KeepAlive would after it died.
    restart: Callable[[str], None] = lambda agent_id: None
    # App Store Connect and the notary service on this machine, and each project's app there.
    apple: LocalApple | None = None
    apps: dict[str, str] = field(default_factory=dict)
    job_ids: list[str] = field(default_factory=list)  # every job the demo started, in order
    seen: dict[str, dict[str, tuple[Any, ...]]] = field(default_factory=dict)  # what watch() printed, per job
    stopping: threading.Event = field(default_factory=threading.Event)  # set on Ctrl-C: every wait gives up

    def pause(self) -> None:
        expect(not self.stopping.wait(POLL_SEC), "interrupted")

    def __post_init__(self) -> None:
        self.api = SerialApi.for_stack(self.stack)

    def say(self, tag: str, message: str) -> None:
        say(tag, message)

    def cli(self, tag: str, *args: str) -> str:
        """Run the real `relevo` CLI against the demo's stack and return what it printed."""
        command = [sys.executable, "-m", "relevo_cli.main", *args, "--stack-file", str(self.stack_file)]
        self.say(tag, f"$ relevo {shlex.join(args)}")
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        output = (done.stdout + done.stderr).strip()
        for line in output.splitlines():
            self.say(tag, f"  ⤷ {line}")
        expect(done.returncode == 0, f"`relevo {' '.join(args)}` exited {done.returncode}: {output}")
        return output

    def run(self, project_id: str, commit: str) -> str:
        return self.track(self.api.run_project(project_id, {"ref": "main", "commit": commit})["job_id"])

    def track(self, job_id: str) -> str:
        if job_id not in self.job_ids:
            self.job_ids.append(job_id)
        return job_id

    def watch(
        self,
        tag: str,
        job_id: str,
        until: Callable[[dict[str, Any]], bool] | None = None,
        timeout: float = 120,
    ) -> dict[str, Any]:
        """Follow a job, printing every change of its status and of its stages, until `until`
        holds (by default: the job ended)."""
        until = until or (lambda job: job["status"] in TERMINAL)
        seen = self.seen.setdefault(job_id, {})
        deadline = time.monotonic() + timeout
        while True:
            job = self.api.get_job(job_id)
            if seen.get("") != (job["status"],):
                seen[""] = (job["status"],)
                why = f" ({job['queue_reason']})" if job.get("queue_reason") else ""
                self.say(tag, f"job {job_id} [bold]{job['status']}[/bold]{why}")
            for stage in job["stages"]:
                state = (stage["status"], stage["attempt"], stage["agent_id"], len(stage["attempts_log"]))
                if seen.get(stage["name"]) != state and stage["status"] != "pending":
                    seen[stage["name"]] = state
                    self.say(tag, f"  stage {stage['name']} → {stage_words(stage)}")
            if until(job):
                return job
            expect(
                job["status"] not in TERMINAL,
                f"job {job_id} ended {job['status']} ({job.get('error')}) too early",
            )
            expect(time.monotonic() < deadline, f"job {job_id} still {job['status']} after {timeout:.0f}s")
            self.pause()


def stage(job: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in job["stages"] if s["name"] == name)


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def seconds_between(start: str | None, end: str | None) -> float | None:
    """Seconds between two ISO timestamps of the job view; None when either is missing."""
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def guarded(name: str, run: Callable[[], ScenarioResult | list[ScenarioResult]]) -> list[ScenarioResult]:
    """A scenario's outcome(s); a refusal or a broken expectation is a ✗ row, not a crash."""
    try:
        result = run()
    except NotHeld as exc:
        return [ScenarioResult(name, False, [str(exc)])]
    except Exception as exc:  # noqa: BLE001 - an error is this scenario's ✗ row, the others still report
        return [ScenarioResult(name, False, [f"{type(exc).__name__}: {exc}"])]
    return result if isinstance(result, list) else [result]
