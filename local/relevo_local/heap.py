"""The emulator's deployed heap, kept out of the garbage collector's full collections.

The embedded AWS lives in one Python process with everything it holds: moto's service models,
the template's resources, the interpreter's parsers, every table's items. CPython's full
(generation 2) collection walks all of it and stops every thread meanwhile: 110 to 330 ms at a
time in bench/agent.py's handoff (gc.callbacks), which was the handoff's p95, and the same pauses
hit the tests of a session's stack. AWS has no such pauses.

So once a stack is deployed, the process's heap is frozen ("gc.freeze: move all objects tracked
by the garbage collector to a permanent generation and ignore them in all future collections",
Python Library Reference, gc): later full collections walk only what was made since, 40 to 90 ms
in the same bench. And they come less often: the youngest generation is collected after 10,000
allocations net of deallocations rather than 700 ("gc.set_threshold"), and a full collection is
due only after ten of the middle one's, themselves after ten of the youngest's: one full
collection in that bench's 30 handoffs rather than twelve, each young one under 15 ms. What is frozen is still
freed by reference counting; a reference cycle among
frozen objects that becomes garbage waits until the last stack of the process stops, which
unfreezes. Only the deployed heap is frozen, not what later collections find alive: the state
machine interpreter's executions are cycles that live a few seconds, and freezing them would keep
each one until the stack stops.
"""

from __future__ import annotations

import gc
import threading

# Allocations net of deallocations before the youngest generation is collected (CPython's default: 700).
YOUNG_THRESHOLD = 10_000

_lock = threading.Lock()
_stacks = 0
_thresholds: tuple[int, ...] = ()


def hold() -> None:
    """A stack of this process is deployed: what the process holds now is frozen."""
    global _stacks, _thresholds
    with _lock:
        _stacks += 1
        if _stacks == 1:
            _thresholds = gc.get_threshold()
            gc.set_threshold(max(YOUNG_THRESHOLD, _thresholds[0]), *_thresholds[1:])
        gc.freeze()


def release() -> None:
    """A stack of this process stopped; with the last, the collector walks everything again."""
    global _stacks
    with _lock:
        if _stacks == 0:
            return
        _stacks -= 1
        if _stacks == 0:
            gc.unfreeze()
            gc.set_threshold(*_thresholds)


def held() -> bool:
    """Whether a stack of this process holds the heap frozen."""
    return _stacks > 0
