"""The operator CLI starts without the emulator and the development tools (issue 31): `relevo
--help`, `relevo job list` and the rest never import moto, the emulator's patches, the IAM lint,
the demo or the drills; `relevo local …` imports the emulator when it runs (the drills are
`relevo-tools drill`, not the CLI's).

Given a fresh interpreter (this test session has imported them through other tests), when it
imports relevo_cli.main (every command group, what the `relevo` script imports), then no module of
relevo_local, relevo_tools, moto, the SAM translator or cfn-lint is loaded.
"""

from __future__ import annotations

import subprocess
import sys

NOT_AT_START = ("relevo_local", "relevo_tools", "moto", "samtranslator", "cfnlint")


def test_importing_the_cli_loads_no_emulator_or_tool_module() -> None:
    script = (
        "import sys, relevo_cli.main\n"
        f"print(sorted(name for name in sys.modules if name.split('.')[0] in {NOT_AT_START!r}))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert shown.stdout.strip() == "[]", shown.stdout
