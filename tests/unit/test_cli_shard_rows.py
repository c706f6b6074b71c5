"""`relevo job view` and `relevo job list` of a job with shards, and its log followed per shard or
interleaved: the CLI's rendering of the API's answers (tests/unit/test_job_view_shards.py makes
the views; the same on the local stack is in tests/integration/test_parallel_stages.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from rich.console import Console

from relevo_cli.cli_errors import UserMistake
from relevo_cli.commands.jobs import chosen_shards, progress_text
from relevo_cli.follow import StageLog
from relevo_cli.job_view import log_tail, render_job
from relevo_cli.words import macs_by_stage
from relevo_core.jobs.logs import stage_marks
from relevo_core.jobs.view import job_items_to_view
from tests.unit.test_job_view_shards import AT, RUNNING, _items

NOW = datetime.fromisoformat(AT.format(30))


def _job() -> dict[str, Any]:
    return {**job_items_to_view(_items("running", RUNNING)), "queue_detail": None}


def _text(renderable: Any) -> list[str]:
    console = Console(width=200, record=True)
    console.print(renderable)
    return [line.rstrip() for line in console.export_text().splitlines()]


def _row(lines: list[str], start: str) -> list[str]:
    row = next(line.replace("┃", "│") for line in lines if line.strip("│┃ ").startswith(start))
    return [cell.strip() for cell in row.strip("│").split("│")]


def test_each_shard_is_a_row_under_its_stage_with_its_mac_attempt_duration_and_result():
    lines = _text(render_job(_job(), NOW))

    header = _row(lines, "#")
    assert header[:7] == ["#", "stage", "status", "attempt", "agent", "duration", "exit"]
    stage = _row(lines, "1")
    assert stage[:6] == ["1", "test", "running", "", "", ""]
    # The shards follow their stage, in order: label, status, attempt, Mac, duration (running: so far)
    rows = [_row(lines, mark) for mark in ("├ 0", "├ 1", "└ 2")]
    assert [row[1:7] for row in rows] == [
        ["├ 0", "succeeded", "1", "mac-1", "12s", "0"],
        ["├ 1", "running", "2", "mac-3", "18s", ""],
        ["└ 2", "pending", "", "", "", ""],
    ]
    # Every row in order: each stage, then its shards under it.
    stage_column = [line.split("│")[2].strip() for line in lines if line.startswith("│")]
    assert stage_column == [
        "build",
        "test",
        "├ 0",
        "├ 1",
        "└ 2",
        "ui",
        "├ device=iPhone 16, os=18.2",
        "└ device=iPad Air, os=18.2",
    ]


def test_the_macs_of_a_job_name_the_shards_they_ran():
    assert macs_by_stage(_job()) == [("mac-1", ["build", "test[0]"]), ("mac-3", ["test[1]"])]


def test_the_job_pages_progress_counts_stage_runs_a_shard_each():
    from relevo_cli.console.summary import run_progress

    assert run_progress(_job()) == (2, 6)  # done: build and test[0], of build, 3 test shards and 2 ui shards


def test_the_list_progress_counts_stage_runs_a_shard_each():
    assert progress_text({"runs_done": 3, "runs_total": 6}) == "3/6"
    assert progress_text({"runs_total": 6}) == "0/6"
    assert progress_text({}) == ""


def test_the_status_log_tail_labels_a_shards_lines_with_its_shard():
    job = {
        **_job(),
        "log_tail": {
            "lines": [
                {"stage": "build", "attempt": 1, "text": "built"},
                {"stage": "test", "attempt": 2, "shard": 1, "text": "ok 7"},
                {"stage": "ui", "attempt": 1, "shard": 0, "text": "booted"},
            ],
            "next_seq": 3,
        },
    }
    printed = log_tail(job)
    assert printed[1:4] == ["build#1 | built", "test[1]#2 | ok 7", "ui[device=iPhone 16, os=18.2]#1 | booted"]


# ---------------------------------------------------------------------------------- the log


def _page(stages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"stages": stages}


def _marks(test_status: str, shard_states: list[tuple[str, int, str | None]]) -> list[dict[str, Any]]:
    """build succeeded on mac-1; test (3 shards) with each shard's (status, attempt, agent)."""
    build = {
        "name": "build",
        "index": 0,
        "status": "succeeded",
        "attempt": 1,
        "agent_id": "mac-1",
        "exit_code": 0,
        "error_class": None,
        "reused_from": None,
        "warning": None,
        "failed_attempts": [],
        "shards": [],
    }
    shards = [
        {
            "shard": index,
            "label": str(index),
            "status": status,
            "attempt": attempt,
            "agent_id": agent,
            "exit_code": None,
            "error_class": "Relevo.Fatal.ExitCode" if status == "failed" else None,
            "failed_attempts": [{"attempt": 1, "agent": "mac-2", "error": "Relevo.Transient.ExitCode"}]
            if attempt == 2
            else [],
        }
        for index, (status, attempt, agent) in enumerate(shard_states)
    ]
    test = {
        "name": "test",
        "index": 1,
        "status": test_status,
        "attempt": None,
        "agent_id": None,
        "exit_code": None,
        "error_class": "Relevo.Fatal.ExitCode" if test_status == "failed" else None,
        "reused_from": None,
        "warning": None,
        "failed_attempts": [],
        "shards": shards,
    }
    deploy = {
        "name": "deploy",
        "index": 2,
        "status": "running" if test_status == "succeeded" else "pending",
        "attempt": 1,
        "agent_id": "mac-1",
        "exit_code": None,
        "error_class": None,
        "reused_from": None,
        "warning": None,
        "failed_attempts": [],
        "shards": [],
    }
    return [build, test, deploy]


def _chunk(
    stage: str, text: str, shard: int | None = None, attempt: int = 1, agent: str = "mac-1"
) -> dict[str, Any]:
    return {"stage": stage, "attempt": attempt, "agent_id": agent, "shard": shard, "text": text}


def _follow(log: StageLog) -> list[str]:
    """The shards of test print side by side (one line cut across two chunks, one shard retried),
    then deploy, which waits for the page to say test ended."""
    out: list[str] = []
    log._write = out.append
    running = _page(
        _marks("running", [("running", 1, "mac-1"), ("running", 2, "mac-3"), ("running", 1, "mac-2")])
    )
    assert log.chunk(_chunk("build", "built\n"), running)
    assert log.chunk(_chunk("test", "shard 0 line 1\nshard 0 li", shard=0), running)
    assert log.chunk(_chunk("test", "flaky\n", shard=1, agent="mac-2"), running)
    assert log.chunk(_chunk("test", "shard 2 line 1\n", shard=2, agent="mac-2"), running)
    assert log.chunk(_chunk("test", "ne 2\n", shard=0), running)
    assert log.chunk(_chunk("test", "shard 1 again\n", shard=1, attempt=2, agent="mac-3"), running)
    # deploy's output waits until a page says test ended (every shard's output is stored by then)
    assert not log.chunk(_chunk("deploy", "deploying\n"), running)
    ended = _page(
        _marks("succeeded", [("succeeded", 1, "mac-1"), ("succeeded", 2, "mac-3"), ("succeeded", 1, "mac-2")])
    )
    assert log.chunk(_chunk("deploy", "deploying\n"), ended)
    log.settle(ended, final=True)
    return out


def test_interleaved_each_line_is_prefixed_by_its_shard_and_the_next_stage_follows_the_stage_whole():
    assert "".join(_follow(StageLog(lambda _: None))).splitlines() == [
        "── build on mac-1 ──",
        "build#1 | built",
        "── build succeeded on mac-1 ──",
        "── test[0] on mac-1 ──",
        "test[0]#1 | shard 0 line 1",
        "── test[1] on mac-2 ──",
        "test[1]#1 | flaky",
        "── test[2] on mac-2 ──",
        "test[2]#1 | shard 2 line 1",
        "test[0]#1 | shard 0 line 2",
        "── test[1]#1 failed on mac-2: Relevo.Transient.ExitCode, retried as attempt 2 ──",
        "── test[1], attempt 2, on mac-3 ──",
        "test[1]#2 | shard 1 again",
        "── test[0] succeeded on mac-1 ──",
        "── test[1]#2 succeeded on mac-3 ──",
        "── test[2] succeeded on mac-2 ──",
        "── test succeeded ──",
        "── deploy on mac-1 ──",
        "deploy#1 | deploying",
    ]


def test_following_one_shard_shows_its_lines_and_markers_only():
    assert "".join(_follow(StageLog(lambda _: None, only=["test"], shards=[1]))).splitlines() == [
        "── test[1] on mac-2 ──",
        "test[1]#1 | flaky",
        "── test[1]#1 failed on mac-2: Relevo.Transient.ExitCode, retried as attempt 2 ──",
        "── test[1], attempt 2, on mac-3 ──",
        "test[1]#2 | shard 1 again",
        "── test[1]#2 succeeded on mac-3 ──",
    ]


def test_a_shard_that_ends_while_its_siblings_run_is_said_at_once():
    out: list[str] = []
    log = StageLog(out.append, only=["test"])
    page = _page(_marks("running", [("running", 1, "mac-1"), ("running", 1, "mac-2"), ("pending", 0, None)]))
    log.chunk(_chunk("test", "a\n", shard=0), page)
    log.chunk(_chunk("test", "b\n", shard=1, agent="mac-2"), page)
    log.settle(
        _page(_marks("running", [("failed", 1, "mac-1"), ("running", 1, "mac-2"), ("pending", 0, None)]))
    )
    assert out[-1] == "── test[0] failed on mac-1: Relevo.Fatal.ExitCode ──\n"
    assert not any("test[1]" in line and "──" in line and "failed" in line for line in out)


STAGES = [
    {"name": "build", "shards": []},
    {"name": "test", "shards": [{"shard": i, "label": str(i)} for i in range(4)]},
    {
        "name": "ui",
        "shards": [
            {"shard": 0, "label": "device=iPhone 16, os=18.2"},
            {"shard": 1, "label": "device=iPad Air, os=18.2"},
        ],
    },
]


def test_shard_is_chosen_by_index_or_by_its_matrix_combination_however_spaced():
    assert chosen_shards("job_x", STAGES, ["test"], ["3", "0"]) == [3, 0]
    assert chosen_shards("job_x", STAGES, ["ui"], ["device=iPad Air,os=18.2"]) == [1]
    assert chosen_shards("job_x", STAGES, ["ui"], ["device=iPhone 16, os=18.2", "1"]) == [0, 1]


@pytest.mark.parametrize(
    ("stage", "shard", "said"),
    [
        (
            [],
            "1",
            "--shard: name the stage whose shards you mean with one --stage (job job_x's stages with "
            "shards: test, ui)",
        ),
        (["test", "ui"], "1", "--shard: name the stage whose shards you mean with one --stage"),
        (["build"], "0", "--shard: stage 'build' of job job_x has no shards (neither parallel nor matrix)"),
        (["test"], "4", "--shard '4': stage 'test' has no such shard; its shards: 0 to 3"),
        (
            ["ui"],
            "device=iPhone 17",
            "--shard 'device=iPhone 17': stage 'ui' has no such shard; its shards: device=iPhone 16, "
            "os=18.2; "
            "device=iPad Air, os=18.2",
        ),
    ],
)
def test_a_shard_that_cannot_be_chosen_is_refused_naming_what_there_is(
    stage: list[str], shard: str, said: str
):
    with pytest.raises(UserMistake) as refused:
        chosen_shards("job_x", STAGES, stage, [shard])
    assert str(refused.value).startswith(said)


def test_the_log_page_marks_and_the_renderer_agree_on_the_shard_labels():
    marks = [stage_marks(stage) for stage in _job()["stages"]]
    log = StageLog(lambda _: None)
    log.chunk(_chunk("ui", "booted\n", shard=1), {"stages": marks})
    assert log.name(("ui", 1, 1)) == "ui[device=iPad Air, os=18.2]"


def test_a_shards_artifact_removed_by_quota_is_noted_naming_its_shard():
    from relevo_cli.job_view import job_notes

    removed = {
        "stage": "test",
        "shard": 2,
        "name": "app.ipa",
        "size": 9,
        "removed_at": AT.format(20),
        "removed_reason": "artifact.max_total_bytes",
    }
    notes = job_notes({**_job(), "artifacts": [removed]})

    assert (
        f"artifact test#shard-2/app.ipa (9 bytes) removed by quota at {AT.format(20)} "
        "(artifact.max_total_bytes)" in notes
    )
