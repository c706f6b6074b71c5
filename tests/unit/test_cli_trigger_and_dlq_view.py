"""`relevo job rerun -q` (and `job release`, `dlq redrive`) print only the job id as `relevo project
run -q` does (docs/jobs.md), and `relevo dlq view JOB` shows the entry as a table like `relevo job
view`, keeping `--json`: the CLI as a newcomer types it (CliRunner), the API answering from a
stand-in with the API's answers (the same commands on the local stack:
tests/integration/test_cli_answers.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from typer.testing import CliRunner

from relevo_cli.commands import common, dlq, jobs, queue
from relevo_cli.main import app

runner = CliRunner()

NEW = "job_00mx7c2vyb3hrcjt8ekf3a98sr"
FAILED = "job_00mx7c2rry436453qsb0fre8mc"
ENTRY = {
    "job_id": FAILED,
    "project": "notarize",
    "state": "open",
    "error": "Relevo.Fatal.ExitCode",
    "failed_stage": "notarize",
    "failed_shards": None,
    "shard_failures": None,
    "attempts": 1,
    "cumulative_backoff_sec": 0,
    "cause": "its command exited 1: [notary] agreement not signed",
    "last_successful_stage": "archive",
    "failed_at": "2026-12-02T12:25:37+00:00",
    "idempotency_key": "notarize:83b9b1ef57d0bad",
    "redriven_as": None,
}


class Api:
    """The API's answers to what these commands ask."""

    def __init__(self, duplicate: bool = False) -> None:
        self.duplicate = duplicate
        self.asked: list[tuple[str, ...]] = []

    def _started(self) -> dict[str, Any]:
        return {"job_id": NEW, "outcome": "queued", **({"duplicate": True} if self.duplicate else {})}

    def rerun_job(self, job_id: str, from_stage: str | None) -> dict[str, Any]:
        self.asked.append(("rerun", job_id, from_stage or ""))
        return self._started()

    def release_job(self, job_id: str) -> dict[str, Any]:
        self.asked.append(("release", job_id))
        return self._started()

    def redrive(self, job_id: str) -> dict[str, Any]:
        self.asked.append(("redrive", job_id))
        return self._started()

    def get_job(self, job_id: str) -> dict[str, Any]:
        return {"job_id": job_id, "status": "running"}

    def dead_letter(self, job_id: str) -> dict[str, Any]:
        return {**ENTRY, "job_id": job_id}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Api:
    served = Api()

    @contextmanager
    def stack_api(_stack_file: Any) -> Iterator[Api]:
        yield served

    for module in (jobs, dlq, queue, common):  # common: `show`, the listing helper, opens it too
        monkeypatch.setattr(module, "stack_api", stack_api)
    monkeypatch.setattr(common.console, "width", 200)
    return served


@pytest.mark.parametrize(
    "command",
    [
        ["job", "rerun", FAILED],
        ["job", "rerun", FAILED, "--from-stage", "notarize"],
        ["job", "release", FAILED],
        ["dlq", "redrive", FAILED],
    ],
)
def test_a_command_that_starts_a_job_prints_only_its_id_with_q(api: Api, command: list[str]):
    # Given a command that starts a job, as a script calls it: NEW=$(relevo job rerun JOB -q)
    # When it runs with -q
    result = runner.invoke(app, [*command, "-q"])

    # Then stdout is the new job's id alone
    assert result.exit_code == 0, result.output
    assert result.stdout == NEW + "\n"
    assert api.asked[0][1] == FAILED


def test_a_rerun_that_is_already_a_job_prints_its_id_and_exits_3_with_q(api: Api):
    # Given a rerun the API answers with the job it already is
    api.duplicate = True

    # When it runs with -q
    result = runner.invoke(app, ["job", "rerun", FAILED, "-q"])

    # Then stdout is that job's id, stderr what it is, and the exit status tells it from a new job
    assert result.exit_code == 3
    assert result.stdout == NEW + "\n"
    assert f"already running as {NEW} (running)" in result.stderr


def test_a_rerun_answers_json_with_json(api: Api):
    result = runner.invoke(app, ["job", "rerun", FAILED, "--json"])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "job_id": NEW,
        "outcome": "queued",
        "duplicate": False,
        "status": "queued",
    }


def test_dlq_view_shows_the_entry_as_a_table_with_the_command_that_resumes_it(api: Api):
    # Given a dead-lettered job
    # When it is viewed
    result = runner.invoke(app, ["dlq", "view", FAILED])

    # Then it is a table, not JSON: what failed, how, the last good stage, the cause, the key
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert not result.stdout.lstrip().startswith("{")
    assert f"{FAILED}  notarize  open" in lines[0]
    rows = {
        cells[0]: cells[1]
        for cells in (
            [c.strip() for c in line.strip("│ ").split("│")] for line in lines if line.startswith("│")
        )
    }
    assert rows["failed stage"] == "notarize"
    assert rows["error"] == "Relevo.Fatal.ExitCode"
    assert rows["attempts"] == "1"
    assert rows["last good stage"] == "archive"
    assert rows["cause"] == "its command exited 1: [notary] agreement not signed"
    assert rows["idempotency key"] == "notarize:83b9b1ef57d0bad"
    assert (
        lines[-1] == f"`relevo dlq redrive {FAILED}` resumes it from notarize, under the same idempotency key"
    )


def test_dlq_view_lists_each_failed_shard(api: Api, monkeypatch: pytest.MonkeyPatch):
    # Given an entry of a stage whose shards 1 and 3 failed, redriven since
    sharded = {
        **ENTRY,
        "failed_stage": "test",
        "failed_shards": [1, 3],
        "redriven_as": NEW,
        "state": "redriven",
        "shard_failures": [
            {
                "shard": 1,
                "error_class": "Relevo.Fatal.ExitCode",
                "attempts": 1,
                "cumulative_backoff_sec": 0,
                "cause": "exit 1",
            },
            {
                "shard": 3,
                "error_class": "Relevo.Lease.Expired",
                "attempts": 3,
                "cumulative_backoff_sec": 7.5,
                "cause": None,
            },
        ],
    }
    monkeypatch.setattr(api, "dead_letter", lambda job_id: sharded)

    # When it is viewed
    result = runner.invoke(app, ["dlq", "view", FAILED])

    # Then the failed stage names its shards, each shard is a row, and the entry says what resumed it
    assert result.exit_code == 0, result.output
    assert "test (shard 1, 3)" in result.stdout
    shard_rows = [
        [c.strip() for c in line.strip("│ ").split("│")]
        for line in result.stdout.splitlines()
        if line.startswith("│ 1 ") or line.startswith("│ 3 ")
    ]
    assert shard_rows == [
        ["1", "Relevo.Fatal.ExitCode", "1", "0s", "exit 1"],
        ["3", "Relevo.Lease.Expired", "3", "7.5s", "-"],
    ]
    assert result.stdout.splitlines()[-1] == f"redriven as {NEW}: `relevo job view {NEW}`"


def test_dlq_view_json_is_the_apis_entry(api: Api):
    result = runner.invoke(app, ["dlq", "view", FAILED, "--json"])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == ENTRY
