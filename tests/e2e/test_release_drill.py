"""`relevo-tools drill release --trials 1` (issue 44, point 5): a local stack, two real
relevo-agent processes and the local Apple service, one trial of each release fault -- the agent
killed after the upload's commit took effect, killed while its notarization is in progress, and
its path to Apple cut at the commit request. The command exits 1 on any duplicate upload or
submission at the local Apple service (tests/integration/test_release_drill_judgment.py shows it
counts them), a stage neither succeeded nor held for review, an in-progress submission not resumed
or a build number given twice; its release table says so per fault."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relevo_tools.drill.release import RELEASE_DRILLS

# No xdist group: the command starts a stack, agents and an Apple service of its own in its own
# work dir, so it shares nothing with test_drill.py's fleet. In that group (e2e-drill) its 94 s
# (CI) ran after the 12 drills on the same worker, lengthening the suite's longest chain.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _release_rows(output: str) -> dict[str, list[str]]:
    """The release table's rows by fault: trials, held, duplicates, resumed, given twice."""
    table = output[output.index("release drill (at the local Apple service)") :]
    rows = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0] in RELEASE_DRILLS:
            rows[cells[0]] = cells[1:]
    return rows


def test_one_trial_of_each_release_fault_holds_with_no_duplicate_at_apple(tmp_path: Path):
    # Given nothing but this checkout: the command starts its own stack, agents and Apple
    # When one trial of each release fault runs
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "relevo_tools.cli",
            "drill",
            "release",
            "--trials",
            "1",
            "--work-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "COLUMNS": "220"},
    )
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("drill-*.log")))

    # Then every trial held: one upload and one submission at Apple, the notarization resumed
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{logs}"
    assert _release_rows(done.stdout) == {
        "release-upload-kill": ["1", "1", "0", "0", "0"],
        "release-notary-kill": ["1", "1", "0", "1", "0"],
        "release-commit-cut": ["1", "1", "0", "0", "0"],
    }
