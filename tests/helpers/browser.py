"""The console's browser tests: the system Chromium (Debian's `chromium`), driven by Playwright,
and a console server on loopback signed in as a given API caller."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from relevo_cli.api import RelevoApi
from relevo_cli.console.server import ConsoleServer
from relevo_cli.console.state import Console
from relevo_cli.console.stream import StreamSettings

CHROMIUM_MISSING = (
    "no Chromium found for the console's browser tests: install Debian's chromium "
    "(apt-get install -y chromium), or set RELEVO_CHROMIUM to a Chromium binary"
)


# Set by .ci/run, which installs Chromium first: there, a missing browser fails the suite instead of
# skipping the browser tests (a skip would let CI pass without them).
REQUIRE_BROWSER = "RELEVO_REQUIRE_BROWSER"


def no_chromium_verdict() -> str:
    """What a run without Chromium does with the browser tests: "fail" where CI asks for them,
    else "skip" (a developer's machine without Chromium), saying what to install either way."""
    return "fail" if os.environ.get(REQUIRE_BROWSER) == "1" else "skip"


def chromium_path() -> str | None:
    """RELEVO_CHROMIUM, else the system Chromium on PATH (Playwright's own download is not used)."""
    return os.environ.get("RELEVO_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def console_server(
    api: RelevoApi, git_base_url: str | None = None, **stream: float
) -> Iterator[ConsoleServer]:
    """A console on a free loopback port for `api`'s caller; `stream`: StreamSettings overrides."""
    with ConsoleServer(
        Console(api, settings=StreamSettings(**stream), git_base_url=git_base_url), port=0
    ) as server:
        yield server


def git_remote(base: Path, repo: str, branches: tuple[str, ...], tags: tuple[str, ...]) -> Path:
    """A bare repository at base/<repo>.git with these branches and tags (one commit)."""
    bare = base / f"{repo}.git"
    work = base / "work" / repo
    work.mkdir(parents=True)
    git = ["git", "-c", "user.email=ci@relevo.invalid", "-c", "user.name=ci", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "--bare", "-q", str(bare)], check=True)
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    (work / "README").write_text("hello\n")
    subprocess.run([*git, "-C", str(work), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-q", "-m", "first"], check=True)
    for tag in tags:
        subprocess.run([*git, "-C", str(work), "tag", tag], check=True)
    refspecs = [f"HEAD:refs/heads/{branch}" for branch in branches] + [f"refs/tags/{tag}" for tag in tags]
    subprocess.run([*git, "-C", str(work), "push", "-q", str(bare), *refspecs], check=True)
    return bare
