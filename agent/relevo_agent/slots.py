"""This agent's capacity: at most `capacity` stages at a time.

A slot is held before each receive, so the poll never takes a message it could not start at once;
a message received is handed to a stage thread with its slot (`started`), and the slot is free
again when that thread ends (`ended`). `running` counts those threads only: a slot held through
an empty long poll is no running stage (a drain, a shutdown and disk hygiene wait for `idle`).
"""

from __future__ import annotations

import threading


class Slots:
    def __init__(self, capacity: int) -> None:
        # Bounded: a slot given back twice is a mistake of the caller, said at once.
        self._free = threading.BoundedSemaphore(capacity)
        self._running = 0
        self._lock = threading.Lock()

    def hold(self, timeout: float) -> bool:
        """A free slot held for a receive, waited for at most `timeout`; False: none came free."""
        return self._free.acquire(timeout=timeout)

    def release(self) -> None:
        """A held slot that started nothing (the receive failed, came back empty, or was handed back)."""
        self._free.release()

    def started(self) -> None:
        """The held slot runs a stage now, on a thread of its own."""
        with self._lock:
            self._running += 1

    def ended(self) -> None:
        """A stage thread ended: its slot is free."""
        with self._lock:
            self._running -= 1
        self._free.release()

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    def idle(self) -> bool:
        return self.running == 0
