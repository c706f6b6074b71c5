"""The holder's side of an attempt's lease: a deadline on this process's monotonic clock that no
network call can block (see relevo_core.fleet.lease_timeline for the numbers).

The deadline is the send time of the last successful renewal plus lease_ttl_sec. Only a renewal
that came back extends it, and it extends it from when it was sent, so a slow answer never buys
time it did not have. The fence comes `fence_margin_sec` before the deadline; whoever watches the
lease (the stage's dead-man supervisor, the keeper's fence thread) learns of each extension.

The threads that keep the lease beside each stage are relevo_agent.keeper's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from relevo_core.fleet.lease_timeline import LeaseTimeline

Listener = Callable[["Lease"], None]


class Lease:
    def __init__(
        self, timeline: LeaseTimeline, sent_at: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeline = timeline
        self.clock = clock
        self._deadline = sent_at + timeline.lease_ttl_sec
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    @property
    def deadline(self) -> float:
        return self._deadline

    @property
    def fence_at(self) -> float:
        """When the holder must SIGTERM its command: the deadline less the fence margin."""
        return self._deadline - self.timeline.fence_margin_sec

    @property
    def grace_sec(self) -> float:
        """The SIGTERM-to-SIGKILL grace a fence gives (the group is dead `skew` before the deadline)."""
        return self.timeline.fence_grace_sec

    def fence_in(self) -> float:
        return self.fence_at - self.clock()

    def fenced(self, at: float | None = None) -> bool:
        return (self.clock() if at is None else at) >= self.fence_at

    def extend(self, sent_at: float) -> bool:
        """A renewal sent at `sent_at` (this clock) came back: the deadline moves, never back."""
        with self._lock:
            if sent_at + self.timeline.lease_ttl_sec <= self._deadline:
                return False
            self._deadline = sent_at + self.timeline.lease_ttl_sec
            listeners = list(self._listeners)
        for listener in listeners:
            listener(self)
        return True

    def watch(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` on every extension; returns the function that stops it."""
        with self._lock:
            self._listeners.append(listener)

        def unwatch() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unwatch
