"""Projects this intake container found busy a moment ago.

A job whose project's lock is taken costs intake one more call: the transaction the lock refuses,
then the one that writes the job queued (store.job_creation). A busy project stays busy for as
long as its running job (minutes), and a burst of pushes comes in seconds, so for
BUSY_PROJECT_MEMORY_SEC after a refusal this container writes the project's next jobs queued at
once. A memory that is wrong, the lock freed meanwhile, costs the job only its queued machine's
turn at the lock, which the machine takes when it is free: the job never waits for nothing.

Only a refusal is remembered: a job written queued from memory does not extend it, so the lock is
tried again at the latest BUSY_PROJECT_MEMORY_SEC after the last time it was seen taken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# A container serves many projects: beyond this many remembered, the lapsed ones are let go.
_PRUNE_ABOVE = 1024


class BusyProjects:
    """(table, project) → until when (on `clock`, a monotonic clock) its lock is taken as taken."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._until: dict[tuple[str, str], float] = {}

    def seems_busy(self, table: str, project_id: str) -> bool:
        with self._lock:
            until = self._until.get((table, project_id))
        return until is not None and self.clock() < until

    def found_busy(self, table: str, project_id: str, memory_sec: float) -> None:
        """The project's lock refused a job just now: remember it for `memory_sec` (0: not at all)."""
        if memory_sec <= 0:
            return
        now = self.clock()
        with self._lock:
            if len(self._until) >= _PRUNE_ABOVE:
                self._until = {key: until for key, until in self._until.items() if until > now}
            self._until[(table, project_id)] = now + memory_sec

    def found_free(self, table: str, project_id: str) -> None:
        """A job of the project took its lock: it is not busy to this container's knowledge."""
        with self._lock:
            self._until.pop((table, project_id), None)

    def clear(self) -> None:
        with self._lock:
            self._until.clear()


busy_projects = BusyProjects()
