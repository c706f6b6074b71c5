"""An Xcode result bundle's tests, from the JSON `xcrun xcresulttool get test-results tests
--path X` prints (Xcode 16 and later; the agent runs it, relevo_agent.test_reports). Its tree:
`testNodes` of Test Plan → Unit (or UI) test bundle → Test Suite → Test Case, a test case's
children its Repetitions (`-retry-tests-on-failure`, `-test-iterations`), Arguments (Swift
Testing's parameterized runs) and Failure Messages (`File.swift:42: message`).

A test's id is `<Target>/<Class>::<name>`: the bundle and the class its nodeIdentifier names
(`Class/testMethod()`), then the test's own name, as canonical_test_id makes it."""

from __future__ import annotations

import json
import re
from typing import Any

from relevo_core.models.test_results import MAX_MESSAGE_CHARS, TestStatus
from relevo_core.test_results import ReportRead, TestRun

RESULTS: dict[str, TestStatus] = {
    "Passed": "passed",
    "Failed": "failed",
    "Skipped": "skipped",
    # An XCTExpectFailure that failed as expected: the test did what it said.
    "Expected Failure": "passed",
}
BUNDLES = ("Unit test bundle", "UI test bundle")
# "CalculatorTests.swift:42: XCTAssertEqual failed: …" (the file and line a Failure Message leads with).
LOCATED = re.compile(r"^(?P<file>[^:\n]+\.(?:swift|m|mm|c|cpp)):(?P<line>\d+): (?P<text>.*)$", re.DOTALL)
DURATION_PART = re.compile(r"(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>h|m|s|ms)\b")


def read_xcresult_json(data: bytes, report: str) -> ReportRead:
    """The test cases of one bundle's `get test-results tests` JSON (`report`: the bundle's path)."""
    read = ReportRead()
    try:
        tree = json.loads(data)
    except (ValueError, UnicodeDecodeError) as fault:
        line = getattr(fault, "lineno", 1)
        read.warnings.append(f"{report}:{line}: xcresulttool's output is not JSON ({type(fault).__name__})")
        return read
    nodes = tree.get("testNodes") if isinstance(tree, dict) else None
    if not isinstance(nodes, list):
        read.warnings.append(f"{report}:1: xcresulttool's output has no testNodes (not a test-results tree)")
        return read
    for node in nodes:
        _walk(node, bundle="", suite="", report=report, read=read)
    return read


def _walk(node: Any, bundle: str, suite: str, report: str, read: ReportRead) -> None:
    if not isinstance(node, dict):
        return
    kind = node.get("nodeType")
    name = str(node.get("name", ""))
    if kind in BUNDLES:
        bundle = name
    elif kind == "Test Suite":
        suite = name
    elif kind == "Test Case":
        read.tests.append(_test_case(node, bundle, suite, report))
        return
    for child in node.get("children") or []:
        _walk(child, bundle, suite, report, read)


def _test_case(node: dict[str, Any], bundle: str, suite: str, report: str) -> TestRun:
    identifier = str(node.get("nodeIdentifier") or node.get("name") or "")
    cls, _, method = identifier.rpartition("/")
    cls = cls or suite
    children = [child for child in node.get("children") or [] if isinstance(child, dict)]
    repetitions = [child for child in children if child.get("nodeType") == "Repetition"]
    final = RESULTS.get(str(node.get("result")), "error")
    runs: list[TestStatus] = [RESULTS.get(str(rep.get("result")), "error") for rep in repetitions]
    if not runs or runs[-1] != final:
        runs.append(final)
    message, file, line = None, None, None
    failures = [
        child
        for child in _descendants(children)
        if child.get("nodeType") == "Failure Message" and child.get("name")
    ]
    if failures:
        text = str(failures[0]["name"])
        located = LOCATED.match(text)
        if located:
            file, line, text = located["file"], int(located["line"]), located["text"]
        message = text[:MAX_MESSAGE_CHARS]
    return TestRun(
        suite="/".join(part for part in (bundle, cls) if part),
        name=method or identifier,
        runs=runs,
        duration_sec=_duration(node),
        file=file,
        line=line,
        message=message,
        report=report,
    )


def _descendants(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for node in nodes:
        found.append(node)
        found.extend(_descendants([child for child in node.get("children") or [] if isinstance(child, dict)]))
    return found


def _duration(node: dict[str, Any]) -> float:
    """Seconds: `durationInSeconds` when given, else its text ("0.12s", "1m 3s", "12ms")."""
    seconds = node.get("durationInSeconds")
    if isinstance(seconds, int | float) and seconds >= 0:
        return float(seconds)
    total = 0.0
    for part in DURATION_PART.finditer(str(node.get("duration") or "").replace(",", ".")):
        value = float(part["value"])
        total += {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}[part["unit"]] * value
    return total
