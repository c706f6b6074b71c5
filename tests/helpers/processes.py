"""Whether a process a test started still runs, seen from the outside (/proc on Linux)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path


def is_dead(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet (its code no longer runs)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    # The state follows the parenthesised command name, which may itself hold spaces or ')'.
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
