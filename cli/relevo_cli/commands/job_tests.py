"""`relevo job tests JOB`: a job's tests as Relevo read them from its stages' reports (GET
/jobs/{id}/tests, docs/test-results.md "Where results show"): the counts, then the tests the
filter keeps (failures first, each with its stage, shard, Mac, time, place and message), paged
through the API up to --limit, and the slowest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from relevo_cli.api import RelevoApi
from relevo_cli.cli_errors import JobId, UserMistake
from relevo_cli.commands.common import StackOption, add_column, show

# A page the API answers (its bound is 500: relevo_core.models.requests.TESTS_MAX_LIMIT).
PAGE = 200
STATUS_STYLE = {"failed": "red", "error": "red", "flaky": "yellow", "skipped": "dim", "passed": "green"}


def fetch_tests(api: RelevoApi, job_id: str, status: str | None, limit: int) -> dict[str, Any]:
    """The first page's answer with `tests` the first `limit` tests the filter keeps, read page
    after page by the API's token; `more`: how many it kept beyond them."""
    answer = api.job_tests(job_id, status=status, limit=min(PAGE, limit))
    tests = list(answer["tests"])
    token = answer["next_page_token"]
    while token is not None and len(tests) < limit:
        page = api.job_tests(job_id, status=status, limit=min(PAGE, limit - len(tests)), page_token=token)
        tests += page["tests"]
        token = page["next_page_token"]
    return {**answer, "tests": tests, "next_page_token": token, "more": answer["matching"] - len(tests)}


def counts_line(counts: dict[str, Any]) -> str:
    """`7 tests: 5 passed (1 flaky), 1 failed, 1 skipped in 13.7 s`."""
    parts = [f"{counts['passed']} passed" + (f" ({counts['flaky']} flaky)" if counts["flaky"] else "")]
    parts += [f"{counts[name]} {name}" for name in ("failed", "error", "skipped") if counts[name]]
    if counts.get("quarantined"):
        parts.append(f"{counts['quarantined']} quarantined")
    return f"{counts['total']} tests: {', '.join(parts)} in {counts['duration_sec']:.1f} s"


def _where(test: dict[str, Any]) -> str:
    stage = test["stage"] if test["shard"] is None else f"{test['stage']}[{test['shard']}]"
    return f"{stage} on {test['agent_id'] or '—'}"


def _place(test: dict[str, Any]) -> str:
    if not test["file"]:
        return ""
    return f"{test['file']}:{test['line']}" if test["line"] else test["file"]


def _table(title: str, tests: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    for name in ("status", "test", "ran in", "time", "file", "message"):
        add_column(table, name)
    for test in tests:
        message = (test["message"] or "").strip().splitlines()
        table.add_row(
            Text(test["status"], style=STATUS_STYLE.get(test["status"], "")),
            Text(test["id"]),
            Text(_where(test)),
            f"{test['duration_sec']:.2f}s",
            Text(_place(test)),
            Text(message[0] if message else ""),
        )
    return table


def render(answer: dict[str, Any]) -> Iterator[Table | str]:
    yield counts_line(answer["counts"])
    for source in answer["sources"]:
        place = source["stage"] if source["shard"] is None else f"{source['stage']}[{source['shard']}]"
        for warning in source["warnings"]:
            yield f"warning: {place}: {warning}"
    if not answer["counts"]["total"]:
        yield "no test results: no stage of this job declared reports, or none was read"
        return
    chosen = answer["status"] or "all"
    yield _table(f"{chosen} tests ({answer['matching']})", answer["tests"])
    if answer["more"]:
        yield f"… {answer['more']} more: --limit to list them, --json for all fields"
    if answer["status"] is None and answer["slowest"]:
        yield _table("slowest", answer["slowest"])


def tests(
    job_id: str = JobId,
    failed: bool = typer.Option(False, "--failed", help="only the failed tests (failed or error)"),
    flaky: bool = typer.Option(False, "--flaky", help="only the flaky tests (failed, then passed)"),
    limit: int = typer.Option(200, "--limit", min=1, max=20_000, help="list at most this many tests"),
    as_json: bool = typer.Option(False, "--json", help="print the tests and counts as JSON"),
    stack_file: Path | None = StackOption,
) -> None:
    """Show a job's tests: counts, then failures, flaky, skipped and passed tests with where each ran."""
    if failed and flaky:
        raise UserMistake("--failed and --flaky each choose the tests listed: give one of them")
    status = "failed" if failed else "flaky" if flaky else None
    show(stack_file, lambda api: fetch_tests(api, job_id, status, limit), as_json, render)
