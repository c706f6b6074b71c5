"""The dead-man supervisor of one stage command: a small process of its own, outside the agent's
interpreter, that kills the command's process group when the agent stops extending its lease
deadline, or dies. macOS has no PDEATHSIG; this works everywhere.

It is run as a script (`python -I -S supervisor.py`) with only the standard library, in a session
of its own: a SIGSTOP sent to the agent's pid does not stop it, and signals meant for the agent's
terminal or process group never reach it. The agent talks to it through its stdin, a pipe only
the agent holds, one line at a time:

    group <pgid>              the process group to watch (sent as soon as the command exists)
    fence <seconds> <grace>   SIGTERM the group <seconds> from now unless extended again, then
                              SIGKILL it <grace> seconds later (sent at start, and by the agent's
                              lease keeper after every successful renewal)
    done                      the command ended on its own: exit without killing anything

End of file before `done` means the agent is gone (the kernel closes the pipe when it dies, for
any reason): SIGTERM now, SIGKILL after the grace. The supervisor exits once the group is gone
or killed. Deadlines are kept on this process's monotonic clock; the agent sends durations, never
clock readings.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

POLL_SEC = 0.05


def _say(words: str) -> None:
    try:
        os.write(2, f"relevo-supervisor[{os.getpid()}]: {words}\n".encode())
    except OSError:
        pass


def group_alive(pgid: int, zombies_are_dead: bool = False) -> bool:
    """Whether a process of the group is still there. With `zombies_are_dead`, a member that
    died and was not reaped yet (the killed leader of a frozen agent, its parent) does not count:
    `ps` tells, on macOS and Linux alike. The supervisor itself needs no such care: it only ever
    stops waiting early."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not zombies_are_dead:
        return True
    listed = subprocess.run(
        ["ps", "-A", "-o", "pgid=,stat="], capture_output=True, text=True, check=False
    ).stdout
    states = [
        fields[1]
        for fields in (line.split() for line in listed.splitlines())
        if len(fields) == 2 and fields[0] == str(pgid)
    ]
    # No line for a group signals still reach: ps could not tell (it failed), so it is alive.
    return not states or any(not state.startswith("Z") for state in states)


def _kill(pgid: int, grace: float, why: str) -> None:
    """SIGTERM the group, SIGKILL whatever is left after `grace`."""
    _say(f"{why}: SIGTERM to process group {pgid}, SIGKILL after {grace:g}s")
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    kill_at = time.monotonic() + grace
    while time.monotonic() < kill_at and group_alive(pgid):
        time.sleep(POLL_SEC)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def supervise(stdin: int = 0) -> int:
    pgid: int | None = None
    term_at: float | None = None
    grace = 0.0
    buffered = b""
    while True:
        now = time.monotonic()
        if pgid is not None and term_at is not None and now >= term_at:
            _kill(pgid, grace, "the lease deadline passed without the agent extending it")
            return 0
        wait = None if term_at is None or pgid is None else max(0.0, term_at - now)
        ready, _, _ = select.select([stdin], [], [], wait)
        if not ready:
            continue
        chunk = os.read(stdin, 4096)
        if not chunk:  # the agent is gone
            if pgid is not None:
                _kill(pgid, grace, "the agent is gone")
            return 0
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            words = line.decode(errors="replace").split()
            if not words:
                continue
            if words[0] == "done":
                return 0
            if words[0] == "group" and len(words) == 2:
                pgid = int(words[1])
            elif words[0] == "fence" and len(words) == 3:
                term_at = time.monotonic() + float(words[1])
                grace = float(words[2])


if __name__ == "__main__":
    # Terminal and job-control signals are the agent's business, not ours.
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    sys.exit(supervise())
