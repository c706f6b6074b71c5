"""Whether the agent can reach its stack, said once a change.

Every loop of the agent (the poll, presence, lease renewals, the outbox, job credentials) retries
a call that failed, some of them four times a second. When the failure is only that nothing
answers (the local stack was stopped, the Mac's network is down), the agent says so once, goes on
trying quietly, and says once more when the stack answers again; the loops keep what they log
for failures that say something new."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import urllib3
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import HTTPClientError

log = logging.getLogger(__name__)


def unreachable(exc: BaseException | None) -> bool:
    """A failure that only says nothing answered: no connection, or a connection that was cut or
    timed out (botocore's kinds, and urllib3's under the claim routes), also when it is the cause
    of the agent's own RouteUnreachable."""
    kinds = (BotoConnectionError, HTTPClientError, urllib3.exceptions.HTTPError)
    return isinstance(exc, kinds) or (exc is not None and isinstance(exc.__cause__, kinds))


def stack_words() -> str:
    """What the agent talks to, in words: the local stack at its endpoint, or AWS in its region."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        return f"the local stack at {endpoint}"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    return f"AWS ({region})" if region else "AWS"


class Reachability:
    """Down since when (None: answering). `failed` says it at the first failure of a streak;
    `answered` at the first success after one."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, where: Callable[[], str] = stack_words
    ) -> None:
        self._clock = clock
        self._where = where
        self._lock = threading.Lock()
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        with self._lock:
            return self._down_since is not None

    def failed(self, exc: BaseException | None) -> bool:
        """True when `exc` only says the stack did not answer (the caller then logs nothing)."""
        if not unreachable(exc):
            return False
        with self._lock:
            first = self._down_since is None
            if first:
                self._down_since = self._clock()
        if first:
            where = self._where()
            hint = " (is it running? `relevo local status`)" if where.startswith("the local stack") else ""
            log.warning("cannot reach %s%s: %s; trying again quietly until it answers", where, hint, exc)
        return True

    def answered(self) -> None:
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.info("%s answers again (it did not for %.0fs)", self._where(), self._clock() - since)


# One agent per process: its loops share what they learn of the stack.
stack = Reachability()
