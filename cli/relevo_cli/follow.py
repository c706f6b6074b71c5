"""`relevo logs JOB [-f]`: print a job's output from a seq on, and with -f keep following it until
the job ends.

The follower keeps one number, the seq after the last chunk it printed, and only ever asks the
API for chunks from there (GET /jobs/{id}/logs?from_seq=). A dropped connection, a timeout, a
throttle or a 5xx is waited out with a capped exponential backoff and the same request is sent
again, so nothing is skipped and nothing printed twice. It stops when a page says the job is
terminal and no more chunks are stored (the status is read before the chunks), and reports the
job's outcome as an exit code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import requests

from relevo_cli.api import ApiError

# Exit codes of `relevo logs -f`: the job's outcome.
OUTCOME_EXIT_CODES = {"succeeded": 0, "failed": 1, "canceled": 1}


def is_transient(exc: BaseException) -> bool:
    """Worth sending the same request again: the network or the service, not the request."""
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return True
    return isinstance(exc, ApiError) and (exc.status >= 500 or exc.status == 429)


@dataclass
class LogFollower:
    """Prints chunks in seq order through `write`; `fetch(from_seq)` is one GET .../logs page.
    `sleep` and `clock` are injected so the loop runs without real waits in tests."""

    fetch: Callable[[int], dict[str, Any]]
    write: Callable[[str], None]
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    warn: Callable[[str], None] = lambda _: None
    # Called with each page whose job status differs from the page before (the first page too).
    status_changed: Callable[[dict[str, Any]], None] = lambda _page: None
    poll_sec: float = 1.0
    backoff_base_sec: float = 0.5
    backoff_max_sec: float = 15.0
    # Give up after failing without a break for this long (the last error is raised).
    give_up_after_sec: float = 600.0
    next_seq: int = 0
    status: str | None = None
    printed: int = 0
    failures: list[str] = field(default_factory=list)

    def backoff(self, failures: int) -> float:
        return min(self.backoff_max_sec, self.backoff_base_sec * 2 ** (failures - 1))

    def _page(self) -> dict[str, Any]:
        """One page from next_seq, retried through transient failures."""
        failing_since: float | None = None
        streak = 0
        while True:
            try:
                return self.fetch(self.next_seq)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                now = self.clock()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= self.give_up_after_sec:
                    raise
                streak += 1
                delay = self.backoff(streak)
                self.failures.append(type(exc).__name__)
                self.warn(f"log read failed ({exc}); resuming from seq {self.next_seq} in {delay:.1f}s")
                self.sleep(delay)

    def _print(self, page: dict[str, Any]) -> None:
        for chunk in page["chunks"]:
            if chunk["seq"] < self.next_seq:
                continue  # already printed (a page can only start later, never earlier: a guard)
            self.write(chunk["text"])
            self.printed += 1
            self.next_seq = chunk["seq"] + 1

    def run(self, follow: bool) -> int:
        """Print until the stored output ends (follow=False: exit 0) or, following, until the job
        ends: its outcome's exit code (0 succeeded, 1 failed or canceled)."""
        while True:
            page = self._page()
            if page["status"] != self.status:
                self.status = page["status"]
                self.status_changed(page)
            self._print(page)
            if page["more"]:
                continue
            if not follow:
                return 0
            if page["terminal"]:
                return OUTCOME_EXIT_CODES.get(page["status"], 1)
            self.sleep(self.poll_sec)
