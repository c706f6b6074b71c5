"""The console's job page: its log shows where each stage attempt ended (the banner `relevo job
logs` prints), in the page's first lines and as the stream goes on; a job that printed nothing
shows a short box saying why, not a tall empty one; and the Handoff table has a row per shard of a
stage with shards (each shard's values and files are its own). Job views are made from stage
records by the core (relevo_core.jobs.view); the stream from scripted log pages."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from starlette.testclient import TestClient

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.console.app import create_app
from relevo_cli.console.banners import tail_with_banners
from relevo_cli.console.render import templates
from relevo_cli.console.security import ConsoleSecrets
from relevo_cli.console.state import Console
from relevo_cli.console.stream import StreamSettings, job_events
from relevo_cli.console.summary import job_summary
from relevo_core.jobs.logs import stage_marks
from relevo_core.jobs.view import job_items_to_view
from relevo_core.store.keys import shard_sk, stage_sk
from tests.helpers.stack_files import UNREACHABLE
from tests.unit.test_job_view_shards import AT, RUNNING, _items

FAST = StreamSettings(poll_sec=0.01, state_sec=100, retry_backoff_sec=0.01, lifetime_sec=60)
NOW = datetime(2026, 12, 3, 10, 1, 0, tzinfo=UTC)


def _stage(
    name: str,
    index: int,
    status: str,
    agent: str | None = "mac-1",
    start: int | None = None,
    end: int | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "index": index,
        "status": status,
        "attempt": None if status == "pending" else 1,
        "agent_id": agent,
        "started_at": None if start is None else AT.format(start),
        "ended_at": None if end is None else AT.format(end),
        "exit_code": None,
        "error_class": None,
        "reused_from": None,
        "warning": None,
        "attempts_log": [],
        "shards": [],
    }


def _chunk(seq: int, stage: str, text: str) -> dict[str, Any]:
    return {
        "seq": seq,
        "next": seq + 1,
        "stage": stage,
        "attempt": 1,
        "agent_id": "mac-1",
        "shard": None,
        "text": text,
    }


def _page(
    stages: list[dict[str, Any]], chunks: list[dict[str, Any]], status: str = "running"
) -> dict[str, Any]:
    return {
        "status": status,
        "terminal": status in ("succeeded", "failed", "canceled"),
        "waiting_stage": None,
        "stages": [stage_marks(stage) for stage in stages],
        "chunks": chunks,
        "more": False,
    }


class Script:
    def __init__(self, *pages: dict[str, Any]) -> None:
        self.pages = list(pages)
        self.asked: list[Any] = []

    def read_logs(self, from_seq: Any) -> dict[str, Any]:
        self.asked.append(from_seq)
        return self.pages.pop(0)

    async def sleep(self, seconds: float) -> None:
        return None


def _events(script: Script) -> list[tuple[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [
            event
            async for event in job_events(
                script.read_logs, lambda: {"current_stage": None}, 0, FAST, script.sleep
            )
        ]

    return [(event["event"], json.loads(event["data"])) for event in asyncio.run(collect())]


def _shown(events: list[tuple[str, Any]]) -> list[str]:
    """The log as the page shows it: each chunk's banners, then its lines; a marks event's banners."""
    shown = []
    for name, data in events:
        if name == "log":
            for chunk in data["chunks"]:
                shown += [f"── {mark['text']} ──" for mark in chunk.get("marks", [])]
                shown += chunk["text"].splitlines()
        elif name == "marks":
            shown += [f"── {mark['text']} ──" for mark in data["marks"]]
    return shown


def test_the_stream_says_where_each_stage_ended_after_its_lines():
    # Given build that prints and ends after 8 s, then sign, which prints, ends, and ends the job
    script = Script(
        _page(
            [_stage("build", 0, "running", start=0), _stage("sign", 1, "pending", None)],
            [_chunk(0, "build", "compiling\n")],
        ),
        _page(
            [_stage("build", 0, "succeeded", start=0, end=8), _stage("sign", 1, "running", "mac-2", start=9)],
            [_chunk(1, "sign", "signing\n")],
        ),
        _page(
            [
                _stage("build", 0, "succeeded", start=0, end=8),
                _stage("sign", 1, "succeeded", "mac-2", start=9, end=12),
            ],
            [],
            status="succeeded",
        ),
    )

    # When the page streams it
    events = _events(script)

    # Then each stage's end comes after its lines and before the next stage's, as the CLI says it
    assert _shown(events) == [
        "compiling",
        "── build succeeded on mac-1 after 8s ──",
        "signing",
        "── sign succeeded on mac-2 after 3s ──",
    ]
    assert [name for name, _ in events][-2:] == ["marks", "done"]


def test_a_later_stages_line_waits_until_a_page_says_the_stage_before_it_ended():
    # Given a page whose stages were read just before build ended, with sign's first line already stored
    running = [_stage("build", 0, "running", start=0), _stage("sign", 1, "pending", None)]
    ended = [_stage("build", 0, "succeeded", start=0, end=5), _stage("sign", 1, "running", "mac-2", start=6)]
    script = Script(
        _page(running, [_chunk(0, "build", "compiling\n"), _chunk(1, "sign", "signing\n")]),
        _page(ended, [_chunk(1, "sign", "signing\n")]),
        _page(
            [ended[0], {**ended[1], "status": "succeeded", "ended_at": AT.format(7)}], [], status="succeeded"
        ),
    )

    # When the page streams it
    events = _events(script)

    # Then sign's line is read again and sent once the end of build can come before it
    assert script.asked == [0, 1, 2]
    assert _shown(events) == [
        "compiling",
        "── build succeeded on mac-1 after 5s ──",
        "signing",
        "── sign succeeded on mac-2 after 1s ──",
    ]


def test_the_pages_first_lines_carry_the_ends_of_the_stages_they_show():
    # Given a job whose build ended after 5 s and whose test shards run, one retried
    job = job_items_to_view(_items("running", RUNNING))
    chunks = [_chunk(0, "build", "built\n"), {**_chunk(1, "test", "ok\n"), "shard": 0}]

    # When the job page opens on its last lines
    placed, after = tail_with_banners(chunks, job)

    # Then build's end comes before the first test line, test[0]'s end after the lines
    assert [chunk.get("marks") for chunk in placed] == [
        [],
        [{"id": "end:build::1", "text": "build succeeded on mac-1 after 5s"}],
    ]
    assert after == [{"id": "end:test:0:1", "text": "test[0] succeeded on mac-1 after 12s"}]


def test_the_banner_ids_name_the_attempt_so_a_resumed_stream_says_nothing_twice():
    # Given a stream resumed after the page showed build's end: the stream says it again
    script = Script(_page([_stage("build", 0, "succeeded", start=0, end=8)], [], status="succeeded"))

    events = _events(script)

    # Then it carries the same id as the page's first lines gave it, which the page shows once
    marks = [data["marks"] for name, data in events if name == "marks"]
    assert marks == [[{"id": "end:build::1", "text": "build succeeded on mac-1 after 8s"}]]


class JobApi(RelevoApi):
    """GET /jobs/{id}, its log and the caller's grants: what the job page reads."""

    def __init__(self, job: dict[str, Any], chunks: list[dict[str, Any]]) -> None:
        super().__init__(f"{UNREACHABLE}/v1", "us-east-1", boto3.session.Session(region_name="us-east-1"))
        self.job = job
        self.chunks = chunks

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self.job

    def grants(self, project_id: str) -> dict[str, Any]:
        return {"grants": [{"principal": "arn:aws:iam::123456789012:user/ana", "level": "operate"}]}

    def queue(self) -> dict[str, Any]:
        return {"jobs": [{"job_id": self.job["job_id"], "queue_position": 1}], "agents": []}

    def job_cost(self, job_id: str) -> dict[str, Any]:
        raise ApiError(409, {"error": "JOB_NOT_STARTED", "message": "no execution yet"})

    def job_logs(
        self, job_id: str, from_seq: Any = None, before_seq: Any = None, limit: Any = None
    ) -> dict[str, Any]:
        return {"chunks": self.chunks, "before_seq": None, "next_seq": len(self.chunks)}


def _job_page(job: dict[str, Any], chunks: list[dict[str, Any]]) -> str:
    secrets_ = ConsoleSecrets()
    app = create_app(
        Console(JobApi(job, chunks), caller=lambda: "arn:aws:iam::123456789012:user/ana"), secrets_, 8765
    )
    client = TestClient(app, base_url="http://127.0.0.1:8765", follow_redirects=False)
    assert client.get(f"/?token={secrets_.token}").status_code == 303
    answer = client.get(f"/jobs/{job['job_id']}")
    assert answer.status_code == 200, answer.text[:2000]
    return answer.text


def _view(status: str, records: dict[str, dict[str, Any]], **fields: Any) -> dict[str, Any]:
    view = job_items_to_view(_items(status, records))
    return {
        **view,
        "artifacts": [],
        "queue_detail": None,
        "log_tail": {"lines": [], "truncated": False, "next_seq": 0},
        **fields,
    }


def _log_box(html: str) -> str:
    return re.search(r'<pre id="log-lines"[^>]*>', html).group(0)


def test_a_job_that_printed_nothing_shows_a_short_box_saying_why():
    # Given a queued job, and one waiting at its approval gate before its first stage
    queued = _view("queued", {})
    waiting = _view("waiting", {}, waiting_stage="build")

    # When their pages open
    queued_box, waiting_box = _log_box(_job_page(queued, [])), _log_box(_job_page(waiting, []))

    # Then the log box is the short empty one, saying why there is nothing
    assert 'class="empty"' in queued_box and 'data-empty="No output yet: the job is queued' in queued_box
    assert (
        'class="empty"' in waiting_box
        and 'data-empty="No output yet: the job waits for approval before build."' in waiting_box
    )
    # and the box is as tall as its lines, up to 28rem, one line while empty (never a fixed 28rem)
    css = (
        Path(__file__).resolve().parents[2] / "cli" / "relevo_cli" / "console" / "static" / "console.css"
    ).read_text()
    box = re.search(r"#log-lines \{([^}]*)\}", css).group(1)
    assert "height: auto" in box and "max-height: 28rem" in box
    assert (
        "#log-lines.empty { min-height: 0; }" in css
        and "#log-lines.empty::before { content: attr(data-empty)" in css
    )


def test_a_job_with_output_opens_on_its_lines_with_their_banners():
    job = _view("running", RUNNING)
    html = _job_page(job, [_chunk(0, "build", "built\n")])

    box = _log_box(html)
    assert 'class="empty"' not in box
    tail = json.loads(
        re.search(r'data-tail="([^"]*)"', box).group(1).replace("&#34;", '"').replace("&quot;", '"')
    )
    assert tail["marks"] == [{"id": "end:build::1", "text": "build succeeded on mac-1 after 5s"}]


def test_the_handoff_table_has_a_row_per_shard_with_its_values_and_files():
    # Given a stage with shards, each of which wrote values and handed files on (its own record's receipt)
    handed = {
        "files": 2,
        "dirs": 1,
        "symlinks": 0,
        "bytes": 2048,
        "uploaded_bytes": 2048,
        "digest": "ab" * 32,
        "manifest": "s3://b/p/j/.relevo-handoff/manifests/test.shard-0.1.json",
        "stored_at": AT.format(19),
        "attempt": 1,
    }
    records = {
        **RUNNING,
        stage_sk(1): {**RUNNING[stage_sk(1)], "status": "succeeded"},
        shard_sk(1, 0): {
            **RUNNING[shard_sk(1, 0)],
            "receipt": {"outputs": {"passed": "212"}, "handoff": handed},
        },
        shard_sk(1, 1): {
            **RUNNING[shard_sk(1, 1)],
            "status": "succeeded",
            "ended_at": AT.format(30),
            "receipt": {"outputs": {"passed": "198"}},
        },
    }
    job = _view("running", records)

    # When the job's details are rendered
    html = templates.get_template("job_parts.html").render(
        job=job,
        buttons=[],
        rerun_from=None,
        caller="arn:x",
        level="manage",
        summary=job_summary(job, None, NOW),
    )

    # Then each shard is a row of the Handoff table, named as the log names it, with its values
    assert "<h2>Handoff</h2>" in html
    table = html.split("<h2>Handoff</h2>", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r'<tr data-stage="test" data-shard="(\d)">\s*<td>([^<]*)</td>', table)
    assert rows == [("0", "test[0]"), ("1", "test[1]")]
    assert '<code>passed</code> = <span title="212">212</span>' in table
    assert '<code>passed</code> = <span title="198">198</span>' in table
    assert "2 files, 1 dir, 0 symlinks, 2.0 KiB (2.0 KiB stored)" in table
