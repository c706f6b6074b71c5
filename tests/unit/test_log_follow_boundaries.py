"""`relevo job logs -f` says where a stage begins when its command starts, where it ends when it
ends (how long it ran, how it ended), and that a quiet stage still runs: a scripted job whose
pages change with an injected clock, followed by the real LogFollower and StageLog (no real
waits). The pages are what GET /jobs/{id}/logs answers: stage marks (relevo_core.jobs.logs
stage_marks) read before the chunks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relevo_cli.follow import HEARTBEAT_SILENT_SEC, LogFollower, StageLog


def _at(second: float) -> str:
    minutes, seconds = divmod(int(second), 60)
    return f"2026-12-02T12:{minutes:02d}:{seconds:02d}+00:00"


@dataclass
class Run:
    """One stage attempt (or shard) of the scripted job: when its command starts and ends (on the
    test's clock), what it prints and when, and how it ends."""

    name: str
    agent: str
    start: float
    end: float
    prints: list[tuple[float, str]] = field(default_factory=list)
    status: str = "succeeded"
    shard: int | None = None
    attempt: int = 1

    def state(self, now: float) -> str:
        if now < self.start:
            return "pending"
        return "running" if now < self.end else self.status

    def mark(self, now: float) -> dict[str, Any]:
        state = self.state(now)
        return {
            "status": state,
            "attempt": None if state == "pending" else self.attempt,
            "agent_id": None if state == "pending" else self.agent,
            "started_at": None if state == "pending" else _at(self.start),
            "ended_at": _at(self.end) if state not in ("pending", "running") else None,
            "exit_code": None
            if state in ("pending", "running")
            else (0 if self.status == "succeeded" else 1),
            "error_class": "Relevo.Fatal.ExitCode" if state == "failed" else None,
            "failed_attempts": [],
        }


class Job:
    """GET /jobs/{id}/logs of a job whose stages run one after another (a stage with shards: its
    runs side by side), as of the clock's time."""

    def __init__(self, stages: list[tuple[str, list[Run]]], clock: list[float]) -> None:
        self.stages = stages
        self.clock = clock

    def page(self, cursor: int | str) -> dict[str, Any]:
        now = self.clock[0]
        marks = []
        for index, (name, runs) in enumerate(self.stages):
            if runs[0].shard is None:
                marks.append(
                    {
                        "name": name,
                        "index": index,
                        "reused_from": None,
                        "warning": None,
                        "shards": [],
                        **runs[0].mark(now),
                    }
                )
                continue
            states = [run.state(now) for run in runs]
            whole = (
                "pending"
                if all(s == "pending" for s in states)
                else "running"
                if any(s in ("pending", "running") for s in states)
                else "succeeded"
            )
            marks.append(
                {
                    "name": name,
                    "index": index,
                    "status": whole,
                    "attempt": None,
                    "agent_id": None,
                    "started_at": None,
                    "ended_at": None,
                    "exit_code": None,
                    "error_class": None,
                    "reused_from": None,
                    "warning": None,
                    "failed_attempts": [],
                    "shards": [
                        {"shard": run.shard, "label": str(run.shard), **run.mark(now)} for run in runs
                    ],
                }
            )
        written = sorted(
            (at, run, text) for _, runs in self.stages for run in runs for at, text in run.prints if at <= now
        )
        chunks = [
            {
                "seq": seq,
                "stage": run.name,
                "attempt": run.attempt,
                "agent_id": run.agent,
                "shard": run.shard,
                "text": text,
            }
            for seq, (_, run, text) in enumerate(written)
        ][int(cursor) :]
        terminal = all(mark["status"] in ("succeeded", "failed") for mark in marks) or any(
            m["status"] == "failed" for m in marks
        )
        return {
            "status": "succeeded" if terminal else "running",
            "terminal": terminal,
            "stages": marks,
            "chunks": chunks,
            "next_seq": int(cursor) + len(chunks),
            "more": False,
            "waiting_stage": None,
            "queue_reason": None,
            "queue_detail": None,
        }


def _follow(
    job: Job, clock: list[float], silent_sec: float = HEARTBEAT_SILENT_SEC
) -> list[tuple[float, str]]:
    """Follow the job to its end; every line printed, with the clock's time it was printed at."""
    printed: list[tuple[float, str]] = []

    def write(text: str) -> None:
        printed.extend((clock[0], line) for line in text.splitlines())

    def sleep(seconds: float) -> None:
        clock[0] += max(seconds, 0.0)

    follower = LogFollower(
        fetch=job.page,
        write=write,
        sleep=sleep,
        clock=lambda: clock[0],
        poll_sec=0.5,
        render=StageLog(write, clock=lambda: clock[0], silent_sec=silent_sec),
    )
    assert follower.run(follow=True) == 0
    return printed


def test_a_quiet_stage_begins_when_its_command_starts_and_ends_with_its_duration():
    # Given `sleep 8; echo archived` on mac-1, claimed at 1 s, then a stage that prints at once
    clock = [0.0]
    job = Job(
        [
            ("archive", [Run("archive", "mac-1", start=1.0, end=9.2, prints=[(9.0, "archived\n")])]),
            ("notify", [Run("notify", "mac-2", start=10.0, end=10.5, prints=[(10.2, "sent\n")])]),
        ],
        clock,
    )

    # When `relevo job logs -f` follows it
    printed = _follow(job, clock)

    # Then archive's begin line comes when its command starts, not 8 s later with its output, and
    # its end line says how long it ran and how it ended
    lines = [line for _, line in printed]
    assert lines == [
        "── archive on mac-1 ──",
        "archive#1 | archived",
        "── archive succeeded on mac-1 after 8s ──",
        "── notify on mac-2 ──",
        "notify#1 | sent",
        "── notify succeeded on mac-2 after 0s ──",
    ]
    when = {line: at for at, line in printed}
    assert 1.0 <= when["── archive on mac-1 ──"] <= 1.5, printed
    assert when["archive#1 | archived"] >= 9.0
    assert 9.2 <= when["── archive succeeded on mac-1 after 8s ──"] <= 9.7, printed


def test_a_stage_silent_for_a_minute_is_said_to_still_run_each_minute_until_it_prints():
    # Given a notarization wait that prints nothing for 150 s, then a line, then nothing for 70 s
    clock = [0.0]
    job = Job(
        [("notarize", [Run("notarize", "mac-eu-1", start=0.0, end=230.0, prints=[(150.0, "Accepted\n")])])],
        clock,
    )

    # When it is followed (the silence threshold is the constant's: 60 s)
    printed = _follow(job, clock)

    # Then a line says it still runs after each minute of silence, counted again from its output
    beats = [(at, line) for at, line in printed if "still running" in line]
    assert [line for _, line in beats] == [
        "── notarize#1 still running on mac-eu-1, 1m silent ──",
        "── notarize#1 still running on mac-eu-1, 2m silent ──",
        "── notarize#1 still running on mac-eu-1, 1m silent ──",
    ]
    assert [round(at) for at, _ in beats] == [60, 120, 210]
    assert [line for _, line in printed][-1] == "── notarize succeeded on mac-eu-1 after 3m 50s ──"


def test_the_silence_threshold_is_a_setting():
    # Given a stage silent for 25 s, followed with a 10 s threshold
    clock = [0.0]
    job = Job([("build", [Run("build", "mac-1", start=0.0, end=25.0)])], clock)

    # When it is followed
    printed = _follow(job, clock, silent_sec=10)

    # Then it is said to still run at 10 s and 20 s, and its end ends the log
    assert [line for _, line in printed] == [
        "── build on mac-1 ──",
        "── build#1 still running on mac-1, 10s silent ──",
        "── build#1 still running on mac-1, 20s silent ──",
        "── build succeeded on mac-1 after 25s ──",
    ]


def test_each_shard_begins_when_it_starts_and_its_lines_name_the_shard():
    # Given a stage of two shards that start 2 s apart and stay quiet, one printing at the end
    clock = [0.0]
    job = Job(
        [
            (
                "test",
                [
                    Run("test", "mac-1", start=0.0, end=70.0, shard=0, prints=[(69.0, "ok\n")]),
                    Run("test", "mac-2", start=2.0, end=40.0, shard=1),
                ],
            )
        ],
        clock,
    )

    # When it is followed
    printed = _follow(job, clock)

    # Then each shard's begin line comes as it starts, its end as it ends, its heartbeat names it
    lines = [line for _, line in printed]
    assert lines == [
        "── test[0] on mac-1 ──",
        "── test[1] on mac-2 ──",
        "── test[1] succeeded on mac-2 after 38s ──",
        "── test[0]#1 still running on mac-1, 1m silent ──",
        "test[0]#1 | ok",
        "── test[0] succeeded on mac-1 after 1m 10s ──",
        "── test succeeded ──",
    ]
    when = {line: at for at, line in printed}
    assert (
        when["── test[1] on mac-2 ──"] <= 2.5 and when["── test[1] succeeded on mac-2 after 38s ──"] <= 40.5
    )


def test_a_retried_attempt_ends_with_how_long_it_ran_before_the_retry_begins():
    # Given attempt 1 that ran 5 s on mac-1 and failed, seen running; the retry dispatched
    log = StageLog(lambda _: None)
    out: list[str] = []
    log._write = out.append
    running = {
        "stages": [
            {
                "name": "test",
                "index": 0,
                "status": "running",
                "attempt": 1,
                "agent_id": "mac-1",
                "started_at": _at(0),
                "ended_at": None,
                "exit_code": None,
                "error_class": None,
                "reused_from": None,
                "warning": None,
                "failed_attempts": [],
                "shards": [],
            }
        ]
    }
    log.settle(running)
    retried = {
        "stages": [
            {
                **running["stages"][0],
                "status": "running",
                "attempt": 2,
                "agent_id": "mac-2",
                "started_at": _at(9),
                "failed_attempts": [
                    {"attempt": 1, "agent": "mac-1", "error": "Relevo.Transient.ExitCode", "at": _at(5)}
                ],
            }
        ]
    }

    # When a page says attempt 2 runs
    log.settle(retried)

    # Then attempt 1's end says how long it ran, then attempt 2 begins
    assert "".join(out).splitlines() == [
        "── test on mac-1 ──",
        "── test#1 failed on mac-1 after 5s: Relevo.Transient.ExitCode, retried as attempt 2 ──",
        "── test, attempt 2, on mac-2 ──",
    ]
