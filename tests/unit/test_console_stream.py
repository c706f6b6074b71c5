"""The console's job stream (issue 18, point 5) on scripted API pages: batches of at most 500
lines, each `log` event's id the seq to resume from, `state` on changes, `done` once the job ended
and its log was read to the end, a refusal passed on, a transient failure waited out."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import boto3
import pytest
import requests

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.console.security import COOKIE
from relevo_cli.console.server import ConsoleServer
from relevo_cli.console.state import Console
from relevo_cli.console.stream import StreamSettings, batches, job_events
from tests.helpers.stack_files import UNREACHABLE

FAST = StreamSettings(poll_sec=0.01, state_sec=100, retry_backoff_sec=0.01, lifetime_sec=60)


def chunk(seq: int, lines: int = 1) -> dict[str, Any]:
    # `next`: the cursor after the chunk, as the API gives it (relevo_core.jobs.logs.chunk_view).
    return {
        "seq": seq,
        "next": seq + 1,
        "stage": "build",
        "attempt": 1,
        "text": "".join(f"{seq}.{i}\n" for i in range(lines)),
    }


def page(
    chunks: list[dict[str, Any]],
    status: str = "running",
    more: bool = False,
    waiting_stage: str | None = None,
) -> dict[str, Any]:
    terminal = status in ("succeeded", "failed", "canceled")
    return {
        "status": status,
        "terminal": terminal,
        "waiting_stage": waiting_stage,
        "chunks": chunks,
        "more": more,
    }


class Script:
    """Hands out the scripted log pages in order and records the from_seq of every read."""

    def __init__(self, *pages: Any) -> None:
        self.pages = list(pages)
        self.asked: list[int] = []
        self.sleeps: list[float] = []

    def read_logs(self, from_seq: int) -> dict[str, Any]:
        self.asked.append(from_seq)
        answer = self.pages.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def run(script: Script, from_seq: int = 0, settings: StreamSettings = FAST) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        events = job_events(
            script.read_logs, lambda: {"current_stage": "build"}, from_seq, settings, script.sleep
        )
        return [event async for event in events]

    return asyncio.run(collect())


def test_a_page_is_sent_in_batches_of_at_most_500_lines_each_resumable_by_its_id():
    chunks = [chunk(seq, lines=100) for seq in range(5, 17)]  # 1,200 lines
    script = Script(page(chunks, more=True), page([], status="succeeded"))
    events = run(script, from_seq=5)
    logs = [event for event in events if event["event"] == "log"]
    sizes = [sum(c["text"].count("\n") for c in json.loads(e["data"])["chunks"]) for e in logs]
    assert sizes == [500, 500, 200]
    assert [e["id"] for e in logs] == ["10", "15", "17"]
    sent = [c["seq"] for e in logs for c in json.loads(e["data"])["chunks"]]
    assert sent == list(range(5, 17))
    assert script.asked == [5, 17]  # the next read starts after the last chunk sent
    assert [e["event"] for e in events] == ["state", "log", "log", "log", "state", "done"]


def test_a_single_chunk_longer_than_a_batch_is_sent_alone_and_whole():
    assert [len(group) for group in batches([chunk(0, 600), chunk(1, 1)], 500)] == [1, 1]


def test_state_is_sent_when_the_status_or_gate_changes_and_done_after_the_last_chunk():
    script = Script(
        page([chunk(0)]),
        page([]),
        page([], status="waiting", waiting_stage="deploy"),
        page([chunk(1)], status="succeeded"),
    )
    events = run(script)
    states = [json.loads(e["data"]) for e in events if e["event"] == "state"]
    assert [(s["status"], s["waiting_stage"]) for s in states] == [
        ("running", None),
        ("waiting", "deploy"),
        ("succeeded", None),
    ]
    assert states[0]["current_stage"] == "build"
    # The last lines go out before the state read that follows them, and done comes last.
    assert [e["event"] for e in events[-3:]] == ["log", "state", "done"]
    assert json.loads(events[-1]["data"]) == {"status": "succeeded", "next_seq": 2}
    assert len(script.sleeps) == 3 and all(
        0 <= s <= 0.01 for s in script.sleeps
    )  # polled between pages with nothing more stored


def test_polls_keep_their_cadence_the_reads_time_counting_toward_the_interval():
    now = [0.0]

    class SlowApi(Script):
        def read_logs(self, from_seq: int) -> dict[str, Any]:
            now[0] += 0.3  # each read of the log takes 0.3 s of the 0.5 s interval
            return super().read_logs(from_seq)

    script = SlowApi(page([chunk(0)]), page([]), page([], status="succeeded"))

    async def collect() -> list[dict[str, Any]]:
        settings = StreamSettings(poll_sec=0.5, state_sec=100, lifetime_sec=60)
        events = job_events(
            script.read_logs,
            lambda: {"current_stage": "build"},
            0,
            settings,
            script.sleep,
            clock=lambda: now[0],
        )
        return [event async for event in events]

    asyncio.run(collect())
    assert script.sleeps == pytest.approx([0.2, 0.2])


def test_lines_are_sent_before_the_job_is_read_again():
    reads: list[str] = []
    script = Script(page([chunk(0)]), page([chunk(1)], status="succeeded"))

    def read_job() -> dict[str, Any]:
        reads.append("job")
        return {"current_stage": "build"}

    async def collect() -> list[str]:
        order: list[str] = []
        async for event in job_events(script.read_logs, read_job, 0, FAST, script.sleep):
            order.append(f"{event['event']} after {len(reads)} job reads")
        return order

    order = asyncio.run(collect())
    # chunk 1 arrives with the status change: it is sent before the job read that change causes.
    assert order == [
        "state after 1 job reads",
        "log after 1 job reads",
        "log after 1 job reads",
        "state after 2 job reads",
        "done after 2 job reads",
    ]


def test_a_refusal_ends_the_stream_with_the_apis_answer_and_a_5xx_is_waited_out():
    refused = ApiError(403, {"error": "FORBIDDEN", "message": "no view permission on job j-1"})
    events = run(Script(ApiError(503, {"message": "busy"}), page([chunk(0)]), refused))
    assert [e["event"] for e in events] == ["state", "log", "refused"]
    assert json.loads(events[-1]["data"])["error"] == "FORBIDDEN"


def test_a_stream_ends_itself_after_its_lifetime():
    ticks = iter(range(100))
    script = Script(*[page([]) for _ in range(10)])

    async def collect() -> list[dict[str, Any]]:
        settings = StreamSettings(poll_sec=0.01, lifetime_sec=3)
        events = job_events(
            script.read_logs,
            lambda: {"current_stage": None},
            0,
            settings,
            script.sleep,
            clock=lambda: next(ticks),
        )
        return [event async for event in events]

    events = asyncio.run(collect())
    assert [e["event"] for e in events] == ["state"]
    assert 1 <= len(script.asked) < 4


@pytest.mark.parametrize("bad", [{"poll_sec": 0}, {"batch_lines": 0}, {"unknown": 1}])
def test_stream_settings_refuse_nonsense(bad):
    with pytest.raises(ValueError):
        StreamSettings(**bad)


def test_a_stages_transfer_is_sent_as_progress_whenever_what_it_says_changes():
    """Issue 18: the Steps' transfer cells follow an upload over the stream, without a reload."""

    def stage(transfer: dict | None) -> dict[str, Any]:
        return {"name": "build", "transfer": transfer, "transfers": [transfer] if transfer else []}

    def reading(files_done: int, bytes_done: int, state: str = "uploading") -> dict[str, Any]:
        return {
            "attempt": 1,
            "state": state,
            "files_done": files_done,
            "files_total": 2,
            "bytes_done": bytes_done,
            "bytes_total": 2048,
            "current_file": None,
            "updated_at": "2026-12-01T12:00:00+00:00",
        }

    jobs = [
        stage(None),
        stage(reading(0, 512)),
        stage(reading(0, 512)),
        stage(reading(1, 1536)),
        stage(reading(2, 2048, "uploaded")),
    ]
    script = Script(page([]), page([]), page([]), page([]), page([], status="succeeded"))

    def read_job() -> dict[str, Any]:
        return {"current_stage": "build", "stages": [jobs.pop(0) if len(jobs) > 1 else jobs[0]]}

    async def collect() -> list[dict[str, Any]]:
        # Each poll waits for its job read: one reading of the upload per poll.
        settings = StreamSettings(
            poll_sec=0.01, state_sec=0.000001, job_read_wait_sec=30, retry_backoff_sec=0.01, lifetime_sec=60
        )
        return [event async for event in job_events(script.read_logs, read_job, 0, settings, script.sleep)]

    events = asyncio.run(collect())
    progress = [json.loads(e["data"])["transfers"]["build"] for e in events if e["event"] == "progress"]
    assert progress == [
        "uploading 1 of 2 files, 512 B of 2.0 KiB (25 %)",
        "uploading 2 of 2 files, 1.5 KiB of 2.0 KiB (75 %)",
        "2 files, 2.0 KiB uploaded",
    ]


def test_the_periodic_job_read_runs_beside_the_polls_log_read_not_ahead_of_the_next_poll():
    """A job read (every state_sec) once came after its poll's log read, so a slow one held back
    the next poll's lines: the log read of a poll with a job read due now runs while it does."""
    import threading

    job_read_under_way, log_read_during_it = threading.Event(), threading.Event()
    overlapped: list[bool] = []
    job_reads = [0]

    class Beside(Script):
        def read_logs(self, from_seq: int) -> dict[str, Any]:
            if job_read_under_way.wait(0.5):
                log_read_during_it.set()
            return super().read_logs(from_seq)

    def read_job() -> dict[str, Any]:
        job_reads[0] += 1
        # The first read opens the stream, before any poll has one due; the last is the one the
        # job's end causes, read after that poll's log read (the job moved since the log read began).
        if job_reads[0] > 1 and script.pages:
            job_read_under_way.set()
            overlapped.append(log_read_during_it.wait(2))
            job_read_under_way.clear()
            log_read_during_it.clear()
        return {"current_stage": "build"}

    script = Beside(page([chunk(0)]), page([chunk(1)]), page([], status="succeeded"))

    async def collect() -> list[dict[str, Any]]:
        settings = StreamSettings(
            poll_sec=0.01, state_sec=0.000001, job_read_wait_sec=30, retry_backoff_sec=0.01, lifetime_sec=60
        )
        return [event async for event in job_events(script.read_logs, read_job, 0, settings, script.sleep)]

    events = asyncio.run(collect())
    assert overlapped and all(overlapped), overlapped
    assert [e["event"] for e in events] == ["state", "log", "log", "state", "done"]


def test_no_poll_waits_for_a_slow_job_read_its_answer_is_taken_once_it_is_in():
    """A job read slower than several polls holds back none of their lines: they go out as they
    are read, and the read's stage and transfer follow when it answers."""
    import threading

    reading, answer, answered = threading.Event(), threading.Event(), threading.Event()
    polls_while_reading: list[int] = []

    class Polls(Script):
        def read_logs(self, from_seq: int) -> dict[str, Any]:
            if len(self.asked) == 2:
                assert reading.wait(10)  # the third poll begins once the job read is under way
            if len(self.asked) == 4:
                answer.set()  # the job read answers during the fifth poll
            if len(self.asked) == 5:
                assert answered.wait(10)
            return super().read_logs(from_seq)

    job_reads = [0]

    def read_job() -> dict[str, Any]:
        job_reads[0] += 1
        if job_reads[0] == 2:  # the periodic read (the first opens the stream)
            polls_while_reading.append(len(script.asked))
            reading.set()
            assert answer.wait(10)
            polls_while_reading.append(len(script.asked))
            answered.set()
            return {"current_stage": "sign"}
        return {"current_stage": "build"}

    script = Polls(
        page([chunk(0)]),
        page([chunk(1)]),
        page([chunk(2)]),
        page([chunk(3)]),
        page([chunk(4)]),
        *[page([]) for _ in range(200)],
    )

    async def collect() -> list[dict[str, Any]]:
        settings = StreamSettings(poll_sec=0.01, state_sec=0.000001, retry_backoff_sec=0.01, lifetime_sec=60)
        seen: list[dict[str, Any]] = []
        async for event in job_events(script.read_logs, read_job, 0, settings, script.sleep):
            seen.append(event)
            if event["event"] == "state" and json.loads(event["data"])["current_stage"] == "sign":
                break
        return seen

    events = asyncio.run(collect())
    # The third to fifth polls' lines went out while the job read was under way.
    assert polls_while_reading[0] <= 3 and polls_while_reading[1] >= 5
    logs = [e for e in events if e["event"] == "log"]
    assert [json.loads(e["data"])["next_seq"] for e in logs] == [1, 2, 3, 4, 5]
    assert events.index(logs[-1]) < len(events) - 1 and events[-1]["event"] == "state"
    assert job_reads[0] == 2


class IdleJob(RelevoApi):
    """A running job whose log stays empty: after its first state, a stream has nothing to send."""

    def job_logs(
        self,
        job_id: str,
        from_seq: int | None = None,
        before_seq: int | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        return page([])

    def get_job(self, job_id: str) -> dict[str, Any]:
        return {"job_id": job_id, "current_stage": "build"}


def test_an_idle_stream_sends_a_ping_comment_every_ping_interval():
    """`: ping` comments keep an idle connection open through proxies, every 15 s unless the
    server's settings say otherwise: here every 0.2 s, on a console served on loopback."""
    assert StreamSettings().ping_sec == 15.0
    interval = 0.2
    api = IdleJob(f"{UNREACHABLE}/v1", "us-east-1", boto3.session.Session(region_name="us-east-1"))
    settings = StreamSettings(ping_sec=interval, poll_sec=60, state_sec=60)
    events: list[str] = []
    pings: list[float] = []
    with ConsoleServer(Console(api, settings=settings), port=0) as server:
        signed_in = requests.get(server.url, allow_redirects=False, timeout=10)
        cookies = {COOKIE: signed_in.cookies[COOKIE]}
        opened = time.monotonic()
        with requests.get(
            f"{server.origin}/jobs/j-1/stream", cookies=cookies, stream=True, timeout=10
        ) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            for line in stream.iter_lines(decode_unicode=True):
                if line.startswith(": ping"):
                    pings.append(time.monotonic() - opened)
                    if len(pings) == 3:
                        break
                elif line:
                    events.append(line)
    # Nothing but the first state was sent: the pings alone kept the stream going...
    assert events == [
        "event: state",
        'data: {"status": "running", "waiting_stage": null, "current_stage": "build"}',
    ]
    # ...each at the interval, none sooner (the nth no earlier than n intervals after the stream opened)
    assert all(at >= n * interval for n, at in enumerate(pings, start=1)), pings
