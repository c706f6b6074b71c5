"""One outgoing HTTP delivery: attempts, waits and when to give up, bounded in time.

Retried: connection failures and timeouts, 5xx, 429, and GitHub's rate limits, which answer 403
or 429 ("Rate limits for the REST API", docs.github.com/en/rest/using-the-rest-api/
rate-limits-for-the-rest-api, "Exceeding the rate limit"): with `retry-after`, not before that
many seconds; with `x-ratelimit-remaining: 0`, not before `x-ratelimit-reset` (epoch seconds);
a secondary limit with neither, not before a minute. Any other 4xx is final (a bad token, a
missing repository: asking again changes nothing). Between other attempts: exponential backoff
with full jitter. A wait that would end past the delivery's deadline is not waited: the delivery
fails there and then, so a stream batch never outlives its function's timeout.

The transport is urllib3 (already in the layer, as botocore's); its own retries are switched off
so that the policy here, with its injected clock and sleep, is the only one.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import urllib3

# GitHub: "Otherwise, wait for at least one minute before retrying."
SECONDARY_LIMIT_WAIT_SEC = 60.0


@dataclass(frozen=True)
class OutgoingRequest:
    target: str  # github_status, gitlab_status, slack, ...
    method: str
    url: str
    body: dict[str, Any]
    # May carry credentials: never logged, never recorded, never dead-lettered.
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    # Where the request goes, without secrets (a Slack webhook URL is itself a secret).
    shown_url: str = ""


@dataclass(frozen=True)
class Attempt:
    number: int
    http_status: int | None
    latency_ms: int
    error: str | None  # None: delivered
    ended_at: float


@dataclass(frozen=True)
class SendResult:
    attempts: tuple[Attempt, ...]
    delivered: bool
    reason: str | None  # why it was given up
    body: bytes = b""  # the delivered response's body (a created check run's id)

    @property
    def last(self) -> Attempt:
        return self.attempts[-1]


@dataclass(frozen=True)
class SendPolicy:
    connect_timeout_sec: float
    read_timeout_sec: float
    attempts: int
    budget_sec: float
    backoff_base_sec: float


class Transport(Protocol):
    def request(self, method: str, url: str, body: bytes, headers: dict[str, str], timeout: Any) -> Any: ...


class Urllib3Transport:
    def __init__(self) -> None:
        self._pool = urllib3.PoolManager(retries=False)

    def request(self, method: str, url: str, body: bytes, headers: dict[str, str], timeout: Any) -> Any:
        return self._pool.request(
            method, url, body=body, headers=headers, timeout=timeout, redirect=False, retries=False
        )


@dataclass
class Clock:
    """Time and waiting, injected: tests wait for nothing."""

    now: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[float, float], float] = random.uniform


def _header(response: Any, name: str) -> str | None:
    value = response.headers.get(name)
    return None if value is None else str(value).strip()


def _rate_limit_wait(response: Any, now: float) -> float | None:
    """Seconds GitHub (or any service answering 429) asks to wait; None: not a rate limit."""
    status = response.status
    retry_after = _header(response, "retry-after")
    if status in (403, 429) and retry_after is not None:
        try:
            return max(0.0, float(retry_after))
        except ValueError:
            return SECONDARY_LIMIT_WAIT_SEC  # an HTTP-date: rare, and at least this long in practice
    if status in (403, 429) and _header(response, "x-ratelimit-remaining") == "0":
        reset = _header(response, "x-ratelimit-reset")
        try:
            return max(0.0, float(reset or "") - now)
        except ValueError:
            return SECONDARY_LIMIT_WAIT_SEC
    if status == 429:
        return None  # rate limited without a hint: plain backoff
    if status == 403 and b"secondary rate limit" in (response.data or b"").lower():
        return SECONDARY_LIMIT_WAIT_SEC
    return None


def send(
    request: OutgoingRequest,
    policy: SendPolicy,
    transport: Transport,
    clock: Clock,
    deadline: float | None = None,
) -> SendResult:
    """Deliver `request`, retrying what is worth retrying, until `deadline` (epoch seconds) at the
    latest (and never past the policy's budget)."""
    started = clock.now()
    end = started + policy.budget_sec if deadline is None else min(deadline, started + policy.budget_sec)
    body = json.dumps(request.body, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "relevo", **request.headers}
    attempts: list[Attempt] = []
    for number in range(1, policy.attempts + 1):
        left = end - clock.now()
        if left <= 0:
            return SendResult(tuple(attempts), False, f"out of time before attempt {number}")
        timeout = urllib3.Timeout(
            connect=min(policy.connect_timeout_sec, left), read=min(policy.read_timeout_sec, left)
        )
        began = clock.now()
        wait: float | None = None
        try:
            response = transport.request(request.method, request.url, body, headers, timeout)
        except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out
            error = f"{type(exc).__name__}"
            status = None
        else:
            status = response.status
            if 200 <= status < 300:
                attempts.append(Attempt(number, status, _millis(began, clock.now()), None, clock.now()))
                return SendResult(tuple(attempts), True, None, bytes(response.data or b""))
            error = f"HTTP {status}"
            wait = _rate_limit_wait(response, clock.now())
            retryable = status >= 500 or status == 429 or wait is not None
            if not retryable:
                attempts.append(Attempt(number, status, _millis(began, clock.now()), error, clock.now()))
                return SendResult(tuple(attempts), False, f"{error}: not retryable")
        attempts.append(Attempt(number, status, _millis(began, clock.now()), error, clock.now()))
        if number == policy.attempts:
            break
        if wait is None:
            wait = clock.jitter(0, policy.backoff_base_sec * 2 ** (number - 1))
        if clock.now() + wait >= end:
            return SendResult(
                tuple(attempts),
                False,
                f"{error}: a retry in {wait:.0f} s would end past the delivery's deadline",
            )
        clock.sleep(wait)
    return SendResult(tuple(attempts), False, f"{attempts[-1].error}: {policy.attempts} attempts failed")


def _millis(began: float, ended: float) -> int:
    return max(0, int((ended - began) * 1000))
