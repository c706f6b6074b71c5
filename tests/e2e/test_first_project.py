"""The README's "Your first project", run step by step exactly as written, so it cannot drift.

Each ```sh block is run with bash, in order (the one marked "in the checkout" in the repository),
sharing shell variables and the current directory from block to block the way one terminal would
(`JOB=$(relevo project run …)`, `cd ~/relevo-hello`), with a home directory of its own. The yaml
block is saved under the name the text gives it, in that directory. A block marked "in a new
terminal; ready when it prints …" is started in the background there and the next step waits for
that text; "then the terminal of … ends with exit 0" waits for that terminal to end and checks its
exit status. Nothing is added: a step the README lacks is a step this test lacks. The checkout is
left as it was (`git status` the same before and after)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

SECTION = re.search(r"^## Your first project\n(.*?)^## ", (ROOT / "README.md").read_text(), re.S | re.M)
BLOCK = re.compile(
    r"(?:<!-- first-project: (?P<marker>[^>]*?) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)^```", re.S | re.M
)
READY = re.compile(r'in a new terminal; ready when it prints "(?P<text>[^"]+)"')
ENDS = re.compile(r'then the terminal of "(?P<command>[^"]+)" ends with exit 0')


@dataclass
class Step:
    lang: str
    body: str
    marker: str
    saved_as: str | None = None


@dataclass
class Terminal:
    command: str
    process: subprocess.Popen[bytes]
    log: Path
    closed: bool = field(default=False)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _steps() -> list[Step]:
    assert SECTION, "README.md has no '## Your first project' section"
    text, steps, start = SECTION.group(1), [], 0
    for match in BLOCK.finditer(text):
        before = text[start : match.start()]
        named = re.findall(r"[Ss]ave this as `([^`]+)`", before)
        steps.append(Step(match["lang"], match["body"], match["marker"] or "", named[-1] if named else None))
        start = match.end()
    return steps


def _fresh_environment(home: Path) -> dict[str, str]:
    """A shell as a person opens it: nothing of this test session's stack or venv on it, and a
    home of its own (the user's cache stays where it is: the local stack's built layer)."""
    venv_bin = str(ROOT / ".venv" / "bin")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELEVO_", "AWS_ENDPOINT_URL", "MOTO_", "PYTEST_", "COV_"))
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["COLUMNS"] = "200"
    env.setdefault("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    env["HOME"] = str(home)
    return env


def _git_status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def _wait_for(terminal: Terminal, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in terminal.output():
        if terminal.process.poll() is not None:
            raise AssertionError(
                f"`{terminal.command}` exited {terminal.process.returncode} before printing "
                f"{text!r}:\n{terminal.output()[-3000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(
                f"`{terminal.command}` did not print {text!r} within {timeout}s:\n{terminal.output()[-3000:]}"
            )
        time.sleep(0.2)


def test_your_first_project_as_the_readme_writes_it(tmp_path: Path):
    steps = _steps()
    home = tmp_path / "home"
    home.mkdir()
    work = home  # where a terminal opens; the README's first block moves on from there
    env = _fresh_environment(home)
    checkout_before = _git_status()
    terminals: list[Terminal] = []
    ran: list[str] = []
    try:
        for number, step in enumerate(steps):
            if step.lang == "yaml":
                assert step.saved_as, "a yaml block of the section names the file to save it as"
                (work / step.saved_as).write_text(step.body)
                continue
            assert step.lang == "sh", step.lang
            ran.append(step.body.strip())
            cwd = ROOT if step.marker == "in the checkout" else work
            ready = READY.fullmatch(step.marker)
            if ready:
                log = tmp_path / f"terminal-{number}.log"
                with open(log, "wb") as out:
                    process = subprocess.Popen(
                        ["bash", "-c", step.body],
                        cwd=cwd,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                terminals.append(Terminal(step.body.strip(), process, log))
                _wait_for(terminals[-1], ready["text"], timeout=240)
                continue
            # One terminal's shell, step after step: its variables carry over (set -a exports them).
            dump = tmp_path / f"env-{number}"
            script = f"set -euo pipefail\nset -a\n{step.body}\nenv -0 > {dump}\n"
            done = subprocess.run(
                ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
            )
            assert done.returncode == 0, (
                f"step {number} failed ({done.returncode}):\n{step.body}\n{done.stdout}\n{done.stderr}"
            )
            env = dict(entry.split("=", 1) for entry in dump.read_text().split("\0") if "=" in entry)
            work = Path(env["PWD"])  # the shell's directory after the block (`cd` carries over)
            ends = ENDS.fullmatch(step.marker)
            if ends:
                [terminal] = [t for t in terminals if t.command.startswith(ends["command"])]
                assert terminal.process.wait(timeout=120) == 0, terminal.output()[-3000:]
                terminal.closed = True

        # What the steps promise, seen from outside them:
        assert ran[0].splitlines()[0] == 'export PATH="$PWD/.venv/bin:$PATH"'
        assert work == home / "relevo-hello" and (work / "hello.yaml").is_file()
        job_id = env["JOB"]
        [follower] = [t for t in terminals if t.command.startswith("relevo job logs")]
        followed = follower.output()
        assert f"waiting for approval before deploy: `relevo job approve {job_id}`" in followed
        assert f"deploying the build of {job_id}" in followed and followed.rstrip().endswith(
            f"job {job_id} succeeded"
        )
        assert (work / "hello.txt").read_text().strip() == f"hello from {job_id}"
        # `relevo local down` was the last step: the stack's terminal has ended.
        [stack] = [t for t in terminals if t.command == "relevo local up"]
        assert stack.process.wait(timeout=60) == 0, stack.output()[-3000:]
        stack.closed = True
        # The checkout is as it was: nothing of the project's files, the stack's state or the download
        assert _git_status() == checkout_before
    finally:
        for terminal in terminals:
            if terminal.process.poll() is None:
                os.killpg(terminal.process.pid, signal.SIGINT)  # Ctrl-C in that terminal
                try:
                    terminal.process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(terminal.process.pid, signal.SIGKILL)
