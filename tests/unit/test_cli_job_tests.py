"""`relevo job tests JOB`: the counts, the tests a filter keeps with the stage, shard and Mac each
ran on, paged through the API (its answers here are relevo_core.jobs.results_listing's own, made
from documents stored as the agent stores them), --json, and a mistake said in one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from relevo_cli.api import RelevoApi
from relevo_cli.commands import job_tests as job_tests_command
from relevo_cli.main import app
from relevo_core.jobs.results_listing import job_tests
from relevo_core.models.requests import JobTestsQuery, parse_query
from tests.helpers.stack_files import unreachable_stack_file
from tests.unit.test_job_tests_listing import JOB, Bucket, _job

runner = CliRunner()


@pytest.fixture()
def api_pages(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """GET /jobs/{id}/tests answered by the listing itself; each request's query kept."""
    bucket = Bucket()
    items = _job(bucket)
    asked: list[dict[str, Any]] = []

    def answer(self: RelevoApi, job_id: str, **params: Any) -> dict[str, Any]:
        given = {name: str(value) for name, value in params.items() if value is not None}
        asked.append(given)
        assert job_id == JOB
        return job_tests(items, bucket.read, parse_query(JobTestsQuery, given))

    monkeypatch.setattr(RelevoApi, "job_tests", answer)
    return asked


pytestmark = pytest.mark.usefixtures("wide_console")


def _run(tmp_path: Path, *args: str):
    return runner.invoke(
        app,
        ["job", "tests", JOB, *args, "--stack-file", str(unreachable_stack_file(tmp_path))],
        terminal_width=220,
    )


def test_the_counts_then_the_failures_first_with_where_each_ran(tmp_path: Path, api_pages):
    # Given a job whose shards stored results; when its tests are shown
    result = _run(tmp_path)

    # Then the counts come first, then failures with their shard, Mac, place and message
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "7 tests: 5 passed (1 flaky), 1 failed, 1 skipped in 13.7 s"
    failure = next(line for line in lines if "t.Math::adds" in line)
    for said in ("failed", "test[0] on mac-2", "tests/t_math.py:12", "assert 2 == 3"):
        assert said in failure, failure
    flaky = next(line for line in lines if "t.Net::retry_me" in line)
    assert "flaky" in flaky and "test[1] on mac-4" in flaky
    assert "slowest" in result.output


def test_failed_and_flaky_filter_and_the_pages_are_followed_up_to_the_limit(
    tmp_path: Path, api_pages, monkeypatch: pytest.MonkeyPatch
):
    # When only the flaky tests are asked for
    flaky = _run(tmp_path, "--flaky")
    # Then the API is asked for them, and only they are listed
    assert flaky.exit_code == 0 and api_pages[-1]["status"] == "flaky"
    assert "t.Net::retry_me" in flaky.output and "t.Math::adds" not in flaky.output

    # When all tests are listed 3 at most, as JSON
    api_pages.clear()
    listed = _run(tmp_path, "--limit", "3", "--json")
    answer = json.loads(listed.stdout)
    # Then the first page holds them, and what is left is said
    assert [test["id"] for test in answer["tests"]] == ["t.Math::adds", "t.Net::retry_me", "t.Math::skips"]
    assert answer["more"] == 4 and answer["counts"]["flaky"] == 1

    # When 5 are asked for, the API's pages 2 tests long
    monkeypatch.setattr(job_tests_command, "PAGE", 2)
    api_pages.clear()
    five = json.loads(_run(tmp_path, "--limit", "5", "--json").stdout)
    # Then the pages are read by their token until 5 are listed, each test once
    assert [page.get("limit") for page in api_pages] == ["2", "2", "1"]
    assert "page_token" not in api_pages[0] and all("page_token" in page for page in api_pages[1:])
    assert len({test["id"] for test in five["tests"]}) == 5 and five["more"] == 2


def test_asking_for_failed_and_flaky_at_once_is_one_line_and_exit_2(tmp_path: Path, api_pages):
    result = _run(tmp_path, "--failed", "--flaky")
    assert result.exit_code == 2
    assert [line for line in result.output.splitlines() if line.strip()] == [
        "--failed and --flaky each choose the tests listed: give one of them"
    ]
    assert api_pages == []
