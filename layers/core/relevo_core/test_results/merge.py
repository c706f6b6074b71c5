"""One attempt's reports into its results document: every test once, by its canonical id, its
runs in order (earlier attempts of the same stage or shard first, then this attempt's reports in
the order they were read), the last run deciding how it ended.

Flaky: a test that failed (or errored) in a run and passed in its last one, whether the rerun was
the runner's own (in one report) or a retry of the shard (an earlier attempt's document). It is
counted once, as passed and flaky. Quarantined: a test the stage's project names; its failure is
reported and counted, and `failed_only_in_quarantine` tells the agent that it alone failed the
command. The limits (relevo_core.models.test_results) cut what is over them, and say so."""

from __future__ import annotations

from collections.abc import Iterable

from relevo_core.models.test_results import (
    FAILING,
    MAX_TEST_ID_CHARS,
    MAX_TESTS,
    MAX_WARNINGS,
    ResultsSummary,
    TestResult,
    TestStatus,
    canonical_test_id,
)
from relevo_core.test_results import ReportRead, TestRun

CUT_MARK = "…"


def test_id(run: TestRun) -> tuple[str, bool]:
    """The run's canonical id, and whether it had to be cut to MAX_TEST_ID_CHARS."""
    full = canonical_test_id(run.suite, run.name)
    if len(full) <= MAX_TEST_ID_CHARS:
        return full, False
    return full[: MAX_TEST_ID_CHARS - len(CUT_MARK)] + CUT_MARK, True


def merge_results(
    reads: Iterable[ReportRead],
    earlier: Iterable[TestResult] = (),
    quarantined: frozenset[str] = frozenset(),
    max_tests: int = MAX_TESTS,
) -> tuple[list[TestResult], ResultsSummary]:
    """The attempt's tests, each once, and their summary (without results_key and sha256, which
    the store adds). `earlier`: the previous attempt's tests of the same stage or shard."""
    before = {test.id: test for test in earlier}
    merged: dict[str, TestResult] = {}
    warnings: list[str] = []
    cut = False
    reports = 0
    dropped = 0
    long_ids = 0
    for read in reads:
        reports += 1
        warnings.extend(read.warnings)
        cut = cut or read.cut
        for run in read.tests:
            ident, shortened = test_id(run)
            long_ids += shortened
            known = merged.get(ident)
            if known is None and len(merged) >= max_tests:
                dropped += 1
                continue
            merged[ident] = _with_run(known or _first(ident, run, before.get(ident), quarantined), run, known)
    if long_ids:
        warnings.append(
            f"{long_ids} test id{'s' if long_ids != 1 else ''} longer than {MAX_TEST_ID_CHARS} characters "
            f"cut to {MAX_TEST_ID_CHARS} (ending {CUT_MARK})"
        )
    if dropped:
        cut = True
        warnings.append(f"{dropped} test{'s' if dropped != 1 else ''} past the limit of {max_tests} not kept")
    tests = [_decided(test) for test in merged.values()]
    return tests, summarize(tests, reports, warnings, cut)


def _first(ident: str, run: TestRun, earlier: TestResult | None, quarantined: frozenset[str]) -> TestResult:
    return TestResult(
        id=ident,
        suite=run.suite,
        name=run.name,
        status="passed",
        runs=list(earlier.runs) if earlier is not None else [],
        quarantined=ident in quarantined,
        report=run.report,
        file=run.file,
        line=run.line,
    )


def _with_run(test: TestResult, run: TestRun, known: TestResult | None) -> TestResult:
    """`test` with one more report's runs of it (a test written in several reports runs again)."""
    failing = [status for status in run.runs if status in FAILING]
    return test.model_copy(
        update={
            "runs": [*test.runs, *run.runs],
            "duration_sec": round(test.duration_sec + run.duration_sec, 6),
            "message": run.message
            if (failing or run.runs[-1] == "skipped") and run.message
            else test.message,
            "file": test.file or run.file,
            "line": test.line if test.file else run.line,
            "report": test.report if known is not None else run.report,
        }
    )


def _decided(test: TestResult) -> TestResult:
    status: TestStatus = test.runs[-1] if test.runs else "passed"
    flaky = status == "passed" and any(run in FAILING for run in test.runs[:-1])
    message = test.message if status != "passed" or flaky else None
    return test.model_copy(update={"status": status, "flaky": flaky, "message": message})


def summarize(tests: list[TestResult], reports: int, warnings: list[str], cut: bool) -> ResultsSummary:
    counts = {status: 0 for status in ("passed", "failed", "error", "skipped")}
    for test in tests:
        counts[test.status] += 1
    if len(warnings) > MAX_WARNINGS:
        more = len(warnings) - (MAX_WARNINGS - 1)
        warnings = [*warnings[: MAX_WARNINGS - 1], f"… and {more} more warnings"]
    return ResultsSummary(
        total=len(tests),
        **counts,
        flaky=sum(test.flaky for test in tests),
        quarantined=sum(test.quarantined for test in tests),
        duration_sec=round(sum(test.duration_sec for test in tests), 3),
        reports=reports,
        warnings=warnings,
        cut=cut,
    )


def failed_only_in_quarantine(tests: list[TestResult], summary: ResultsSummary) -> bool:
    """The tests alone explain a failed command, and every failing one is quarantined: at least
    one failed, none outside the quarantine did, and every report was read cleanly (a warning, a
    cut: what was not read may have failed too)."""
    failing = [test for test in tests if test.status in FAILING]
    return (
        bool(failing)
        and all(test.quarantined for test in failing)
        and not summary.warnings
        and not summary.cut
        and summary.reports > 0
    )
