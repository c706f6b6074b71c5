"""The `relevo logs -f` loop on its own: scripted API pages and failures, an injected sleep and
clock (no real waits). The same loop against the local stack through dropped connections is in
tests/integration/test_job_output.py."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from relevo_cli.api import ApiError
from relevo_cli.follow import LogFollower, is_transient


class Log:
    """A growing log served the way GET /jobs/{id}/logs serves it: at most `limit` chunks from
    from_seq, `more` when more are stored, the status read before the chunks."""

    def __init__(self, limit: int = 2) -> None:
        self.chunks: list[str] = []
        self.status = "running"
        self.limit = limit
        self.asked: list[int] = []
        self.script: dict[int, BaseException] = {}

    def page(self, from_seq: int) -> dict[str, Any]:
        call = len(self.asked)
        self.asked.append(from_seq)
        if call in self.script:
            raise self.script[call]
        status = self.status
        shown = self.chunks[from_seq : from_seq + self.limit]
        return {
            "status": status,
            "terminal": status in ("succeeded", "failed", "canceled"),
            "chunks": [{"seq": from_seq + i, "text": text} for i, text in enumerate(shown)],
            "next_seq": from_seq + len(shown),
            "more": len(self.chunks) > from_seq + len(shown),
        }


def _follower(
    log: Log, out: list[str], sleeps: list[float], on_sleep=lambda: None, **kwargs: Any
) -> LogFollower:
    now = [0.0]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds
        on_sleep()

    return LogFollower(fetch=log.page, write=out.append, sleep=sleep, clock=lambda: now[0], **kwargs)


def test_following_prints_every_chunk_once_through_failures_and_exits_with_the_outcome():
    # Given a job that writes a line per poll and ends after six, and a connection that fails
    # three times in a row, then loses one more request, then answers 502
    log, out, sleeps = Log(), [], []
    log.script = {
        2: requests.ConnectionError("connection refused"),
        3: requests.ConnectionError("connection reset"),
        4: requests.Timeout("read timed out"),
        7: requests.ConnectionError("remote end closed connection without response"),
        9: ApiError(502, {"error": None, "message": "Internal server error"}),
    }

    def job_writes() -> None:
        if sleeps[-1] != 0.25:
            return  # a backoff: the job moves on between polls only
        if len(log.chunks) < 6:
            log.chunks.append(f"line {len(log.chunks)}\n")
        else:
            log.status = "succeeded"

    follower = _follower(log, out, sleeps, on_sleep=job_writes, poll_sec=0.25)

    # When it follows from the start
    code = follower.run(follow=True)

    # Then every line is printed exactly once, in order, and the exit code is the job's outcome
    assert out == [f"line {i}\n" for i in range(6)]
    assert code == 0 and follower.status == "succeeded"
    # and after each failure the same seq was asked for again, after a growing backoff
    assert [log.asked[i] == log.asked[i + 1] for i in (2, 3, 4, 7, 9)] == [True] * 5
    assert sleeps[sleeps.index(0.5) : sleeps.index(0.5) + 3] == [0.5, 1.0, 2.0]
    assert follower.failures == [
        "ConnectionError",
        "ConnectionError",
        "Timeout",
        "ConnectionError",
        "ApiError",
    ]


@pytest.mark.parametrize(("status", "code"), [("succeeded", 0), ("failed", 1), ("canceled", 1)])
def test_a_finished_job_is_printed_to_its_end_in_pages_and_exits_with_its_outcome(status: str, code: int):
    log, out, sleeps = Log(limit=3), [], []
    log.chunks, log.status = [f"{i}\n" for i in range(10)], status
    follower = _follower(log, out, sleeps, next_seq=4)

    assert follower.run(follow=True) == code
    assert out == [f"{i}\n" for i in range(4, 10)]
    assert sleeps == []  # more was stored: read on without waiting
    assert log.asked == [4, 7]


def test_without_follow_it_stops_at_the_end_of_the_stored_output():
    log, out, sleeps = Log(limit=4), [], []
    log.chunks = ["a", "b", "c", "d", "e"]

    assert _follower(log, out, sleeps).run(follow=False) == 0
    assert out == ["a", "b", "c", "d", "e"] and sleeps == []


def test_a_refusal_is_not_retried_and_a_long_outage_is_given_up():
    log, out, sleeps = Log(), [], []
    log.script = {0: ApiError(403, {"error": "FORBIDDEN", "message": "no"})}
    with pytest.raises(ApiError):
        _follower(log, out, sleeps).run(follow=True)
    assert sleeps == []

    down = Log()
    down.script = {i: requests.ConnectionError("down") for i in range(1000)}
    with pytest.raises(requests.ConnectionError):
        _follower(down, out, sleeps, give_up_after_sec=60, backoff_max_sec=15).run(follow=True)
    assert sum(sleeps) >= 60 and max(sleeps) == 15


def test_what_counts_as_transient():
    assert is_transient(requests.ConnectionError()) and is_transient(requests.Timeout())
    assert is_transient(ApiError(503, {})) and is_transient(ApiError(429, {"error": "THROTTLED"}))
    assert not is_transient(ApiError(404, {"error": "JOB_NOT_FOUND"})) and not is_transient(ValueError())


def test_the_gate_line_comes_after_the_lines_already_stored():
    # Given a job waiting at its gate whose build printed three lines, stored over two pages
    log, out, sleeps = Log(limit=2), [], []
    log.chunks = ["line 0\n", "line 1\n", "line 2\n"]
    log.status = "waiting"

    def approved() -> None:
        log.status = "succeeded"

    def said(page: dict) -> None:
        if page["status"] == "waiting":
            out.append("waiting for approval before deploy")

    follower = _follower(log, out, sleeps, on_sleep=approved, status_changed=said, poll_sec=0.5)

    # When `relevo logs -f` follows it from the start
    assert follower.run(follow=True) == 0

    # Then the stored lines come first, and only then what the job waits for
    assert out == ["line 0\n", "line 1\n", "line 2\n", "waiting for approval before deploy"]
