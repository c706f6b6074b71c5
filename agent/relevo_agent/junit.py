"""JUnit XML, as runners write it: `<testsuites>` or a lone `<testsuite>`, suites nested or not,
each `<testcase classname= name= time= [file= line=]>` with a `<failure>`, `<error>` or
`<skipped>` child, or none (passed). Reruns in one report are read as runs of one test: Maven
Surefire's spelling, which JUnit reporters share (`<flakyFailure>` / `<flakyError>`: failed, then
passed on a rerun; `<rerunFailure>` / `<rerunError>` beside the final `<failure>`: failed every
time), and a test case written again under the same id (a runner that reports every run).

The XML is untrusted (a build wrote it): parsed by defusedxml, which refuses entity declarations
(no expansion bomb, no external entity read) and never fetches a DTD. A malformed or truncated
report keeps the test cases read before the fault and says where it is (file:line)."""

from __future__ import annotations

import io
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import iterparse

from relevo_core.models.test_results import MAX_MESSAGE_CHARS, TestStatus
from relevo_core.test_results import ReportRead, TestRun

# A rerun's element and the status of that run (Surefire's XSD, surefire-test-report-3.0.xsd).
RERUNS: dict[str, TestStatus] = {
    "flakyFailure": "failed",
    "flakyError": "error",
    "rerunFailure": "failed",
    "rerunError": "error",
}
FINAL: dict[str, TestStatus] = {"failure": "failed", "error": "error", "skipped": "skipped"}


def read_junit(data: bytes, report: str, truncated_at: int | None = None) -> ReportRead:
    """The test cases of one JUnit report (`report`: its path, as warnings name it).
    `truncated_at`: the report was read only up to this many bytes (the limit), which is said."""
    read = ReportRead()
    if not data.strip():
        read.warnings.append(f"{report}:1: empty: no XML in it")
        return read
    suites: list[str] = []
    saw_root = False
    try:
        for event, element in iterparse(
            io.BytesIO(data), events=("start", "end"), forbid_dtd=False, forbid_entities=True
        ):
            tag = _local(element.tag)
            if event == "start":
                if not saw_root:
                    saw_root = True
                    if tag not in ("testsuites", "testsuite", "testcase"):
                        read.warnings.append(f"{report}:1: not a JUnit report (its root is <{tag}>)")
                        return read
                if tag == "testsuite":
                    suites.append(element.get("name", ""))
                continue
            if tag == "testcase":
                read.tests.append(_test_case(element, suites[-1] if suites else "", report))
                element.clear()  # a large report is not kept whole in memory
            elif tag == "testsuite" and suites:
                suites.pop()
    except ParseError as fault:
        line = fault.position[0] if fault.position else 1
        if truncated_at is not None:
            read.warnings.append(
                f"{report}:{line}: cut at {truncated_at} bytes (the report size limit); "
                f"{len(read.tests)} test{'s' if len(read.tests) != 1 else ''} read before the cut"
            )
            read.cut = True
        else:
            read.warnings.append(
                f"{report}:{line}: malformed or truncated XML ({_fault_text(fault)}); "
                f"{len(read.tests)} test{'s' if len(read.tests) != 1 else ''} read before it"
            )
        return read
    except DefusedXmlException as refused:
        read.warnings.append(
            f"{report}:1: refused, not read: {type(refused).__name__} (entity declarations in a test "
            "report are never expanded)"
        )
        read.tests.clear()
        return read
    if not saw_root:
        read.warnings.append(f"{report}:1: empty: no XML in it")
    return read


def _test_case(case: Element, suite_name: str, report: str) -> TestRun:
    runs: list[TestStatus] = []
    final: TestStatus = "passed"
    message: str | None = None
    for child in case:
        tag = _local(child.tag)
        if tag in RERUNS:
            runs.append(RERUNS[tag])
            message = message or _message(child)
        elif tag in FINAL:
            final = FINAL[tag]
            message = _message(child) or message
    runs.append(final)
    if final == "passed" and not any(run != "passed" for run in runs):
        message = None
    return TestRun(
        suite=case.get("classname") or suite_name,
        name=case.get("name", ""),
        runs=runs,
        duration_sec=_seconds(case.get("time")),
        file=case.get("file") or None,
        line=_line(case.get("line")),
        message=message,
        report=report,
    )


def _message(element: Element) -> str | None:
    """A failure's or skip's message: its attribute, else its text's first lines, kept short."""
    text = element.get("message") or (element.text or "").strip()
    return text[:MAX_MESSAGE_CHARS] if text else None


def _seconds(value: str | None) -> float:
    try:
        seconds = float((value or "0").replace(",", ""))
    except ValueError:
        return 0.0
    return seconds if seconds >= 0 and seconds == seconds and seconds != float("inf") else 0.0


def _line(value: str | None) -> int | None:
    try:
        line = int(value or "")
    except ValueError:
        return None
    return line if line >= 1 else None


def _local(tag: object) -> str:
    """An element's name without a namespace ({uri}name), as some writers add one."""
    text = str(tag)
    return text.rsplit("}", 1)[-1]


def _fault_text(fault: ParseError) -> str:
    # expat's message ends with its own "line N, column M": the line is already said.
    return str(fault).split(": line ")[0]
