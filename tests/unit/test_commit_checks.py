"""The checks on every commit: `make check` runs ruff (format and rules) and mypy, `make lint` runs
it first, and CI (.ci/run) runs it before `make test`, failing on either. mypy checks the five
packages and the Lambda handlers, strict by default."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _recipe(target: str) -> tuple[str, list[str]]:
    """A Makefile target's prerequisites and its commands, as make would run them (`make -n`)."""
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(rf"^{target}:(.*)$", makefile, re.M)
    assert rule is not None, f"no `{target}` target"
    # Run under `make test` too: without its MAKELEVEL and flags, this make is a top-level one and
    # prints no "Entering directory" line.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}}
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", ".venv/.relevo-installed", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    return rule.group(1), [line.strip() for line in dry.splitlines() if line.strip()]


def test_make_check_runs_the_format_check_ruff_and_mypy():
    # Given the Makefile, When `make check` is dry-run
    _, commands = _recipe("check")
    # Then it runs the three checks over the whole tree, mypy configured by pyproject.toml alone
    assert commands == [".venv/bin/ruff format --check .", ".venv/bin/ruff check .", ".venv/bin/mypy"]


def test_make_lint_runs_the_checks_first():
    # Given the Makefile, When `make lint` is dry-run
    _, commands = _recipe("lint")
    # Then the three checks come before the template's linters
    assert commands[:3] == [".venv/bin/ruff format --check .", ".venv/bin/ruff check .", ".venv/bin/mypy"]
    assert any("cfn-lint" in command for command in commands[3:])


def test_ci_runs_the_checks_before_the_tests_and_stops_on_a_failure():
    # Given CI's script
    script = (ROOT / ".ci" / "run").read_text()
    # Then it stops at the first failing command, and runs the checks, then the tests
    assert "set -euo pipefail" in script
    lines = [line.strip() for line in script.splitlines()]
    assert lines.index("make check") < lines.index("make test")


def test_mypy_checks_every_package_and_handler_strict_by_default():
    # Given pyproject.toml's mypy settings
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    # Then the packages and functions/ are its files, each handler a module of its own
    assert set(settings["files"]) == {
        "layers/core/relevo_core",
        "agent/relevo_agent",
        "cli/relevo_cli",
        "local/relevo_local",
        "tools/relevo_tools",
        "functions",
    }
    assert settings["explicit_package_bases"] is True
    # And it is strict, with no ignore left unused or without its code
    assert settings["strict"] is True and settings["warn_unused_ignores"] is True
    assert "ignore-without-code" in settings["enable_error_code"]
