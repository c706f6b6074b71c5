"""The job page's Tests tab: GET /jobs/{id}/tests' answers as the tab shows them -- the counts, the
page of tests the filter keeps (failures first, each with its message, shard and Mac), a link to
the next page by the API's token, the flaky tests, the slowest. A 20,000-test job is never fetched
whole: one page of at most PAGE_SIZE, and the flaky ones (at most FLAKY_SHOWN) beside it."""

from __future__ import annotations

from typing import Any

from relevo_cli.console.state import Console

PAGE_SIZE = 100
FLAKY_SHOWN = 20
SLOWEST_SHOWN = 10
FILTERS = ("failed", "flaky", "skipped", "passed")


def tests_tab_context(
    console: Console, job_id: str, status: str | None, page_token: str | None
) -> dict[str, Any]:
    """What the tab shows of the job's tests (an ApiError, such as a stale page token, is the
    route's to show). `status` is one of FILTERS or None (all)."""
    job = console.api.get_job(job_id)
    listing = console.api.job_tests(
        job_id, status=status, limit=PAGE_SIZE, page_token=page_token, slowest=SLOWEST_SHOWN
    )
    counts = listing["counts"]
    flaky: list[dict[str, Any]] = []
    if counts["flaky"] and status != "flaky":
        flaky = console.api.job_tests(job_id, status="flaky", limit=FLAKY_SHOWN, slowest=0)["tests"]
    filters = [
        (None, "All", counts["total"]),
        ("failed", "Failed", counts["failed"] + counts["error"]),
        ("flaky", "Flaky", counts["flaky"]),
        ("skipped", "Skipped", counts["skipped"]),
        ("passed", "Passed", counts["passed"] - counts["flaky"]),
    ]
    warnings = [
        (source["stage"] if source["shard"] is None else f"{source['stage']}[{source['shard']}]", warning)
        for source in listing["sources"]
        for warning in source["warnings"]
    ]
    return {
        "job": job,
        "listing": listing,
        "counts": counts,
        "chosen": status,
        "filters": filters,
        "flaky": flaky,
        "warnings": warnings,
        "first_page": page_token is None,
    }


def place(test: dict[str, Any]) -> str:
    """Where a test ran: `test[2] on mac-3`."""
    stage = test["stage"] if test["shard"] is None else f"{test['stage']}[{test['shard']}]"
    return f"{stage} on {test['agent_id'] or '—'}"
