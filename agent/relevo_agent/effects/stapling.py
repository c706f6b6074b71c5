"""The stapler: `xcrun stapler` on macOS, or the command an agent is configured with (a recorded
double in tests on Linux). `validate <file>` says whether the file carries its notarization ticket
(it only reads); `staple <file>` fetches the ticket from Apple and attaches it, harmless again.
Both are bounded by the stage's time left."""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

MAC_STAPLER = ("xcrun", "stapler")
# What can carry a ticket: a disk image or an installer package (an .app too, which the notary
# service takes only zipped, and a .zip cannot).
STAPLEABLE = (".dmg", ".pkg")
OUTPUT_SHOWN = 400


class StaplerDidNotRun(Exception):
    """The command could not be run, or outlasted its time."""


class Stapler:
    def __init__(self, command: Sequence[str], timeout_sec: float = 120) -> None:
        self.command = tuple(command)
        self.timeout_sec = timeout_sec

    @classmethod
    def for_agent(cls, command: Sequence[str] | None, timeout_sec: float = 120) -> Stapler | None:
        """The configured command, else `xcrun stapler` on macOS; None elsewhere (no stapler)."""
        if command:
            return cls(command, timeout_sec)
        return cls(MAC_STAPLER, timeout_sec) if platform.system() == "Darwin" else None

    def carries_ticket(self, file: Path, time_left: Callable[[], float]) -> bool:
        return self._run("validate", file, time_left)[0] == 0

    def staple(self, file: Path, time_left: Callable[[], float]) -> tuple[int, str]:
        """Its exit code and the end of what it printed."""
        return self._run("staple", file, time_left)

    def _run(self, action: str, file: Path, time_left: Callable[[], float]) -> tuple[int, str]:
        timeout = max(1.0, min(self.timeout_sec, time_left()))
        try:
            done = subprocess.run(
                [*self.command, action, str(file)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise StaplerDidNotRun(f"`stapler {action} {file.name}` did not run: {error}") from error
        return done.returncode, done.stdout.strip()[-OUTPUT_SHOWN:]
