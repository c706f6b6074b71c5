"""Whether this agent may take a new stage: its own pause or drain and its region's dispatch pause
(relevo_core.store.agent_pauses), read with every presence write (relevo_agent.presence).

A pause lasts until its stored `until` (the operator's wall clock) and, whichever comes first,
`timeout_sec` after this agent first saw it, on this process's monotonic clock: a Mac whose wall
clock is behind cannot stretch a pause past what the operator asked for. A pause this agent can no
longer read (the table unreachable) stays as last read until its monotonic deadline.

A drain is pause + exit when idle, for launchd (KeepAlive restarts the agent): only an instance
that was running when the drain appeared (first seen after its first read, no clock compared)
exits; the instance launchd starts after it finds the drain already there and stays paused until
the drain ends or is resumed, so a drained Mac does not restart and exit in a loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from relevo_core.models.status import QueueReason
from relevo_core.store.agent_pauses import AgentPause


@dataclass(frozen=True)
class _Seen:
    pause: AgentPause
    deadline: float  # monotonic
    # A drain that appeared while this instance ran (not one it found at its start).
    exit_when_idle: bool = False


class PauseGate:
    """The pauses as last read, each with its monotonic deadline."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._reads = 0
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._own: _Seen | None = None
        self._dispatch: _Seen | None = None

    def _remember(self, seen: _Seen | None, pause: AgentPause | None, now: datetime) -> _Seen | None:
        if pause is None or not pause.active(now):
            return None
        if seen is not None and seen.pause.pause_id == pause.pause_id:
            return _Seen(pause, seen.deadline, seen.exit_when_idle)  # the same pause: the same clock
        left = min(pause.timeout_sec, (pause.until - now).total_seconds())
        return _Seen(pause, self._monotonic() + left, exit_when_idle=pause.drain and self._reads > 0)

    def observe(self, own: AgentPause | None, dispatch: AgentPause | None, now: datetime) -> None:
        """What the latest read found (None: no such pause, or resumed)."""
        with self._lock:
            self._own = self._remember(self._own, own, now)
            self._dispatch = self._remember(self._dispatch, dispatch, now)
            self._reads += 1

    def has_read(self) -> bool:
        """Whether any read has come in: before it, this instance cannot know it is paused."""
        with self._lock:
            return self._reads > 0

    def _live(self, seen: _Seen | None) -> AgentPause | None:
        return seen.pause if seen is not None and self._monotonic() < seen.deadline else None

    def blocking(self) -> AgentPause | None:
        """The pause that keeps this agent from taking a new stage now, if any."""
        with self._lock:
            return self._live(self._own) or self._live(self._dispatch)

    def reason(self) -> str | None:
        return QueueReason.AGENT_PAUSED.value if self.blocking() is not None else None

    def drain_requested(self) -> bool:
        """A drain that appeared while this instance ran: exit once idle."""
        with self._lock:
            own = self._own
            return own is not None and own.exit_when_idle and self._live(own) is not None
