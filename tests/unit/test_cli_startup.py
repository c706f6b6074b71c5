"""The operator CLI starts without the emulator (issue 31): `relevo --help`, `relevo job list` and
the rest never import moto or the emulator's patches; `relevo local …` imports them when it runs.

Given a fresh interpreter, when it imports relevo_cli.main (every command group), then no module of
relevo_local, moto, the SAM translator or cfn-lint is loaded.
"""

from __future__ import annotations

import subprocess
import sys

EMULATOR = ("relevo_local", "moto", "samtranslator", "cfnlint")


def test_importing_the_cli_loads_no_emulator_module() -> None:
    script = (
        "import sys, relevo_cli.main\n"
        f"print(sorted(name for name in sys.modules if name.split('.')[0] in {EMULATOR!r}))\n"
    )
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.strip() == "[]", shown.stdout
