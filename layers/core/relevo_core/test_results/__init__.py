"""A stage's test reports read into Relevo's own results (relevo_core.models.test_results):

    junit     JUnit XML from any runner (pytest, jest-junit, go-junit-report, Surefire's reruns)
    xcresult  the JSON of `xcrun xcresulttool get test-results tests` (Xcode 16+)
    merge     runs of one test across reports and attempts into one result each: flaky told
              apart, quarantine applied, the limits kept and every cut said

The agent reads a stage's reports with these (relevo_agent.test_reports); nothing here reads a
file or runs a tool itself, so every reader is tested on recorded bytes. A report is untrusted
input (a build wrote it): a malformed one is a warning naming the file and line, never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relevo_core.models.test_results import TestStatus


@dataclass
class TestRun:
    """One test as one report says it ran: its runs in order (a runner's reruns in the same report
    give several), the last deciding how it ended."""

    suite: str
    name: str
    runs: list[TestStatus]
    duration_sec: float = 0.0
    file: str | None = None
    line: int | None = None
    message: str | None = None
    report: str | None = None


@dataclass
class ReportRead:
    """What one report gave: its tests, and what was wrong with it (each warning names the file,
    and the line where the reader knows it)."""

    tests: list[TestRun] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cut: bool = False
