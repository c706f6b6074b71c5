"""The agent process's memory on Linux (glibc): fewer malloc arenas.

glibc gives threads arenas of their own (up to 8 per core) and keeps what they free for reuse, so
a process whose transfer threads each allocate and free megabyte buffers (a handoff's packs,
hashing, s3transfer's parts: up to 20 threads) ends a transfer holding several arenas' worth of
freed memory. bench/handoff.py measured the store side at 122 MB peak with glibc's default and
below its 100 MB target with two arenas, at the same speed (M_ARENA_MAX, mallopt(3)). macOS's
allocator has no such setting and returns large blocks to the system itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_ARENA_MAX = -8  # malloc.h
ARENAS = 2


def fewer_arenas() -> bool:
    """Limit glibc's malloc to ARENAS arenas; True when it was glibc and took it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and the like: no mallopt, nothing to do
        return False
    return bool(mallopt(_M_ARENA_MAX, ARENAS))
