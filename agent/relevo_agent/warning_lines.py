"""A stage's warnings: the lines its command marks as warnings (`::warning::text`, GitHub
Actions' spelling, with or without parameters: `::warning file=a.swift,line=3::text`) and an exit
code the stage declares a warning (`warning_exit_codes`). Either makes a stage that otherwise
succeeded end `warning`: the job goes on."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from relevo_core.models.plan import StagePlan

WARNING_LINE = re.compile(r"^::warning(?: [^:]*)?::(.*)$")
# The first few warnings' text rides on the receipt (and the job view); the rest are counted.
KEPT = 5
KEPT_CHARS = 200


class WarningLines:
    """Sees every piece of the command's output on its way to the log (`write` is passed on
    unchanged) and counts the lines marked as warnings, keeping the first KEPT."""

    def __init__(self, write: Callable[[bytes], Any]) -> None:
        self._write = write
        self._partial = b""
        self._lock = threading.Lock()
        self.count = 0
        self.first: list[str] = []

    def write(self, data: bytes) -> Any:
        with self._lock:
            *lines, self._partial = (self._partial + data).split(b"\n")
            for line in lines:
                self._see(line)
        return self._write(data)

    def _see(self, line: bytes) -> None:
        match = WARNING_LINE.match(line.decode("utf-8", errors="replace").rstrip("\r"))
        if match:
            self.count += 1
            if len(self.first) < KEPT:
                self.first.append(match.group(1).strip()[:KEPT_CHARS])

    def close(self) -> None:
        with self._lock:
            if self._partial:
                self._see(self._partial)
            self._partial = b""


def ended_well(plan: StagePlan, exit_code: int) -> bool:
    """The command's exit says the stage did its work: 0, or one of its warning exit codes."""
    return exit_code == 0 or exit_code in plan.warning_exit_codes


def warning_summary(
    plan: StagePlan, exit_code: int, lines: WarningLines, tests: str | None = None
) -> dict[str, Any] | None:
    """What makes a stage that ended well a `warning` one (None: a plain success), as its receipt
    carries it: the exit code it declared a warning, the lines marked, the first of them, what
    its test reports say (`tests`: an unreadable report, a failure only of quarantined tests),
    and a sentence for people."""
    lines.close()
    if exit_code == 0 and not lines.count and tests is None:
        return None
    said = []
    if tests is not None:
        said.append(tests)
    if exit_code != 0 and exit_code in plan.warning_exit_codes:
        said.append(f"exit {exit_code} (one of its warning_exit_codes)")
    if lines.count:
        said.append(
            f"{lines.count} line{'s' if lines.count != 1 else ''} marked ::warning::"
            + (f", first: {lines.first[0]}" if lines.first else "")
        )
    return {
        "exit_code": exit_code if exit_code != 0 else None,
        **({"tests": tests} if tests is not None else {}),
        "lines": lines.count,
        "first": lines.first,
        "text": "; ".join(said),
    }
