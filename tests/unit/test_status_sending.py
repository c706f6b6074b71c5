"""notify.sending against a local recorder: what is retried, how long it waits (GitHub's "Rate
limits for the REST API", "Exceeding the rate limit"), and that a delivery ends inside its budget
whatever the other side does. The clock's sleep is injected: nothing here waits for real except
the hung endpoint's read timeout."""

from __future__ import annotations

import time

from relevo_core.notify.sending import Clock, OutgoingRequest, SendPolicy, Urllib3Transport, send


class FakeTime:
    """A clock whose sleep only advances it."""

    def __init__(self) -> None:
        self.t = time.time()
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def _policy(**overrides):
    return SendPolicy(
        **{
            "connect_timeout_sec": 1.0,
            "read_timeout_sec": 1.0,
            "attempts": 4,
            "budget_sec": 60.0,
            "backoff_base_sec": 1.0,
            **overrides,
        }
    )


def _send(recorder, policy=None, fake=None):
    fake = fake or FakeTime()
    request = OutgoingRequest(
        "github_status",
        "POST",
        recorder.url + "/repos/acme/app/statuses/abc1234",
        {"state": "pending"},
        headers={"Authorization": "Bearer s3cr3t"},
    )
    return send(
        request,
        policy or _policy(),
        Urllib3Transport(),
        Clock(now=fake.now, sleep=fake.sleep, jitter=lambda a, b: b),
    ), fake


def test_two_500s_then_success_is_delivered_on_the_third_attempt_after_backoff(recorder):
    recorder.answer(500, times=2)
    result, fake = _send(recorder)
    assert result.delivered
    assert [a.http_status for a in result.attempts] == [500, 500, 201]
    assert fake.slept == [1.0, 2.0]  # full jitter's upper bound (jitter injected): base * 2^(n-1)
    assert len(recorder.received()) == 3


def test_429_waits_what_retry_after_says(recorder):
    recorder.answer(429, headers={"Retry-After": "7"})
    result, fake = _send(recorder)
    assert result.delivered and fake.slept == [7.0]


def test_github_primary_rate_limit_waits_until_the_reset(recorder):
    fake = FakeTime()
    recorder.answer(403, headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(fake.t) + 12)})
    result, fake = _send(recorder, fake=fake)
    assert result.delivered
    assert 11 <= fake.slept[0] <= 12


def test_github_secondary_rate_limit_with_retry_after_is_a_403_to_retry(recorder):
    recorder.answer(
        403, headers={"retry-after": "3"}, body=b'{"message": "You have exceeded a secondary rate limit"}'
    )
    result, fake = _send(recorder)
    assert result.delivered and fake.slept == [3.0]


def test_a_plain_403_or_422_is_final(recorder):
    recorder.answer(403, body=b'{"message": "Resource not accessible by integration"}')
    result, fake = _send(recorder)
    assert not result.delivered and len(result.attempts) == 1 and fake.slept == []
    assert "not retryable" in result.reason


def test_a_wait_past_the_budget_is_not_waited(recorder):
    recorder.answer(429, headers={"Retry-After": "120"})
    result, fake = _send(recorder, policy=_policy(budget_sec=20))
    assert not result.delivered and fake.slept == []
    assert "past the delivery's deadline" in result.reason


def test_every_attempt_failing_gives_up_after_the_policy_s_attempts(recorder):
    recorder.answer(502, times=10)
    result, _ = _send(recorder, policy=_policy(attempts=3))
    assert not result.delivered and [a.http_status for a in result.attempts] == [502, 502, 502]


def test_a_hung_endpoint_costs_the_read_timeout_per_attempt_and_never_more_than_the_budget(recorder):
    recorder.hang_always(30)
    started = time.monotonic()
    result = send(
        OutgoingRequest("github_status", "POST", recorder.url + "/x", {}),
        _policy(read_timeout_sec=0.3, budget_sec=1.0, backoff_base_sec=0.05),
        Urllib3Transport(),
        Clock(jitter=lambda a, b: b),
    )
    elapsed = time.monotonic() - started
    assert not result.delivered
    assert all(a.error == "ReadTimeoutError" for a in result.attempts)
    assert elapsed < 1.6, f"the delivery took {elapsed:.2f} s with a budget of 1 s"
