"""What the operator CLI loads when it starts (issue 31): the development tools (relevo_tools: the
IAM lint, the demo, the drills) are a package of their own that `relevo` imports only inside the
command that runs one (`relevo drill`), so `relevo --help` never pays for them.

Given a fresh interpreter, when it imports relevo_cli.main (what the `relevo` script imports),
then no relevo_tools module is loaded."""

from __future__ import annotations

import json
import subprocess
import sys

NOT_AT_START = ("relevo_tools",)


def test_the_cli_starts_without_the_development_tools() -> None:
    # A subprocess: this test session itself has imported relevo_tools through other tests.
    probe = "import json, sys, relevo_cli.main; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60).stdout)
    assert [name for name in loaded if name.split(".")[0] in NOT_AT_START] == []
