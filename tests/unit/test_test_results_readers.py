"""Test reports read into Relevo's results (relevo_core.test_results): JUnit from real runners
(pytest run here for real, go-junit-report's and jest-junit's published output), xcresulttool's
recorded JSON, reruns and retries told apart as flaky, quarantine, limits, untrusted XML and
odd test ids."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from relevo_agent.junit import read_junit
from relevo_core.models.test_results import ResultsDocument, ResultsSummary, pytest_node_id
from relevo_core.models.test_results import TestResult as Result
from relevo_core.test_results.merge import failed_only_in_quarantine, merge_results
from relevo_core.test_results.xcresult import read_xcresult_json

FIXTURES = Path(__file__).parent / "test_reports_fixtures"

ODD_SUITE = """
import pytest


@pytest.mark.parametrize("value", ["a::b", 'say "hi"', "ünïcødé ✓", "line\\nbreak", "<&>"])
def test_odd(value):
    assert value != "a::b"


def test_passes():
    pass


def test_ünïcødé():
    pass


@pytest.mark.skip(reason="not on this platform")
def test_skipped():
    pass
"""


def _pytest_junit(tmp_path: Path) -> bytes:
    (tmp_path / "test_odd.py").write_text(ODD_SUITE, encoding="utf-8")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "--junitxml=report.xml",
            "test_odd.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    return (tmp_path / "report.xml").read_bytes()


def test_a_real_pytest_report_with_odd_ids_survives_the_round_trip(tmp_path: Path):
    # Given the JUnit report of a real pytest run whose ids hold ::, quotes, unicode, a newline
    data = _pytest_junit(tmp_path)

    # When it is read, merged and stored as a document, then read back from its JSON
    tests, summary = merge_results([read_junit(data, "report.xml")])
    document = ResultsDocument(
        job_id="j", stage="test", attempt=1, agent_id="a", summary=summary, tests=tests
    )
    back = ResultsDocument.model_validate_json(document.model_dump_json())

    # Then every test is there once, counted, and each id is what pytest's node id gives
    assert (summary.total, summary.passed, summary.failed, summary.skipped) == (8, 6, 1, 1)
    assert back == document
    ids = {test.id for test in back.tests}
    assert pytest_node_id('test_odd.py::test_odd[say "hi"]') in ids
    # pytest writes a parameter's non-ASCII escaped, a test's own name as it is
    assert pytest_node_id("test_odd.py::test_odd[\\xfcn\\xefc\\xf8d\\xe9 \\u2713]") in ids
    assert pytest_node_id("test_odd.py::test_ünïcødé") in ids
    assert pytest_node_id("test_odd.py::test_odd[line\\nbreak]") in ids
    assert "test_odd::test_odd[a::b]" in ids  # its :: is the parameter's, not a separator
    failed = next(test for test in back.tests if test.status == "failed")
    assert failed.id == "test_odd::test_odd[a::b]" and "assert" in (failed.message or "")


def test_pytest_rerunfailures_writes_only_the_final_run():
    # Given pytest's recorded report of a --reruns 1 run (test_flaky failed once, then passed)
    read = read_junit((FIXTURES / "pytest_rerunfailures_16.1.xml").read_bytes(), "out.xml")

    # When it is merged
    tests, summary = merge_results([read])

    # Then the final runs are what is read: the report gives no rerun to call flaky
    assert {test.name: test.status for test in tests} == {
        "test_flaky": "passed",
        "test_always_fails": "failed",
        "test_passes": "passed",
    }
    assert summary.flaky == 0 and not summary.warnings


def test_go_junit_report_and_jest_junit_output_are_read():
    # Given go-junit-report's and jest-junit's published output
    go = read_junit((FIXTURES / "go_junit_report_skip.xml").read_bytes(), "go.xml")
    jest = read_junit((FIXTURES / "jest_junit_readme.xml").read_bytes(), "jest.xml")

    # When they are merged
    tests, summary = merge_results([go, jest])

    # Then each test is read with its suite, time and a skip's message
    by_id = {test.id: test for test in tests}
    assert by_id["name::TestOne"].status == "skipped"
    assert by_id["name::TestOne"].message == "file_test.go:11: Skip message"
    assert by_id["name::TestTwo"].duration_sec == pytest.approx(0.13)
    assert by_id["addition positive numbers::should add up"].status == "passed"
    assert (summary.total, summary.reports) == (3, 2)


def test_surefire_reruns_in_one_report_make_a_flaky_test_counted_once():
    # Given a report in Surefire's rerun spelling: a test that failed then passed, one that failed thrice
    xml = b"""<testsuite name="s">
      <testcase classname="c" name="recovers" time="0.5"><flakyFailure message="first try"/></testcase>
      <testcase classname="c" name="stays"><failure message="boom"/><rerunFailure message="again"/>
        <rerunFailure message="and again"/></testcase>
    </testsuite>"""

    # When it is read and merged
    tests, summary = merge_results([read_junit(xml, "r.xml")])

    # Then the first is flaky and passed, counted once; the second failed with its own message
    by_name = {test.name: test for test in tests}
    assert by_name["recovers"].flaky and by_name["recovers"].status == "passed"
    assert by_name["recovers"].runs == ["failed", "passed"]
    assert by_name["stays"].status == "failed" and not by_name["stays"].flaky
    assert (summary.total, summary.passed, summary.failed, summary.flaky) == (2, 1, 1, 1)


def test_a_test_that_failed_in_an_earlier_attempt_and_passes_now_is_flaky():
    # Given the earlier attempt's document said c::t failed
    earlier = [Result(id="c::t", suite="c", name="t", status="failed", runs=["failed"])]
    now = read_junit(b'<testsuite><testcase classname="c" name="t"/></testsuite>', "r.xml")

    # When this attempt's report says it passed
    tests, summary = merge_results([now], earlier)

    # Then it is flaky, its runs in order, counted once
    assert tests[0].runs == ["failed", "passed"] and tests[0].flaky
    assert (summary.total, summary.flaky, summary.passed) == (1, 1, 1)


def test_a_failure_only_of_quarantined_tests_is_told():
    # Given a report where only a quarantined test failed
    xml = b"""<testsuite><testcase classname="c" name="ok"/>
      <testcase classname="c" name="wobbly"><failure message="timing"/></testcase></testsuite>"""
    tests, summary = merge_results([read_junit(xml, "r.xml")], quarantined=frozenset({"c::wobbly"}))

    # Then the failure is reported and counted, and it alone failed the command
    assert summary.failed == 1 and summary.quarantined == 1
    assert failed_only_in_quarantine(tests, summary)
    # but not when another test failed too, or a report could not be read cleanly
    other = read_junit(
        b'<testsuite><testcase classname="c" name="x"><error/></testcase></testsuite>', "o.xml"
    )
    assert not failed_only_in_quarantine(
        *merge_results([read_junit(xml, "r.xml"), other], [], frozenset({"c::wobbly"}))
    )
    bad = read_junit(b"<testsuite><testcase", "bad.xml")
    assert not failed_only_in_quarantine(
        *merge_results([read_junit(xml, "r.xml"), bad], [], frozenset({"c::wobbly"}))
    )


def test_a_truncated_report_is_a_warning_naming_the_file_and_line_and_keeps_what_was_read():
    # Given a report cut in the middle of its third test case
    xml = (
        b'<testsuite name="s">\n<testcase classname="c" name="a"/>\n'
        b'<testcase classname="c" name="b"/>\n<testcase cla'
    )

    # When it is read
    read = read_junit(xml, "results/unit.xml")

    # Then the two whole test cases are kept and the warning names the file and line
    assert [test.name for test in read.tests] == ["a", "b"]
    assert read.warnings and read.warnings[0].startswith("results/unit.xml:4: malformed or truncated XML")
    assert "2 tests read before it" in read.warnings[0]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"", "results/x.xml:1: empty"),
        (b"<project><name>x</name></project>", "results/x.xml:1: not a JUnit report"),
        (b"\x00\x01garbage", "results/x.xml:1: malformed or truncated XML"),
    ],
)
def test_a_report_that_is_no_junit_is_a_warning_not_a_crash(data: bytes, said: str):
    read = read_junit(data, "results/x.xml")

    assert read.tests == [] and read.warnings[0].startswith(said)


def test_entity_declarations_are_refused_never_expanded():
    # Given a report with a billion-laughs style entity declaration
    xml = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>
<testsuite><testcase classname="c" name="&lol2;"/></testsuite>"""

    # When it is read
    read = read_junit(xml, "evil.xml")

    # Then nothing of it is read, and the refusal is said
    assert read.tests == []
    assert read.warnings[0].startswith("evil.xml:1: refused, not read: EntitiesForbidden")


def test_over_the_limits_tests_are_cut_and_the_cut_said():
    # Given a report of five tests and a limit of three, and an id over the length limit
    cases = "".join(f'<testcase classname="c" name="t{n}"/>' for n in range(5))
    long = f'<testcase classname="c" name="{"x" * 2000}"/>'
    read = read_junit(f"<testsuite>{long}{cases}</testsuite>".encode(), "r.xml")

    # When it is merged under the limit
    tests, summary = merge_results([read], max_tests=3)

    # Then three are kept, the cut is said, and the long id was shortened and said so
    assert len(tests) == 3 and summary.total == 3 and summary.cut
    assert any("past the limit of 3 not kept" in warning for warning in summary.warnings)
    assert any("longer than 1024 characters" in warning for warning in summary.warnings)
    assert len(tests[0].id) == 1024 and tests[0].id.endswith("…")


def test_a_report_cut_at_the_size_limit_says_the_cut():
    # Given a report read only up to the size limit
    data = b'<testsuite><testcase classname="c" name="a"/><testcase classname="c" name="b"/>'

    # When it is read knowing it was cut
    read = read_junit(data[:60], "big.xml", truncated_at=60)

    # Then what was whole is kept and the cut is said
    assert read.cut and [test.name for test in read.tests] == ["a"]
    assert "cut at 60 bytes (the report size limit)" in read.warnings[0]


def test_recorded_xcresulttool_output_is_read_with_target_and_class_in_the_suite():
    # Given xcresulttool's recorded test-results JSON
    read = read_xcresult_json(
        (FIXTURES / "xcresulttool_tests_fragments.json").read_bytes(), "build/T.xcresult"
    )

    # When it is merged
    tests, summary = merge_results([read])

    # Then each test case is read with its bundle and class, and the empty plan adds nothing
    by_id = {test.id: test for test in tests}
    assert (
        by_id["PeachTests/AdaptiveNoteStrategyTests::weightedDifficultyKernelNarrowing()"].status == "failed"
    )
    assert by_id["PeachTests/AdaptiveNoteStrategyTests::mechanicalRatioTargetsWeakSpots()"].status == "passed"
    assert (summary.total, summary.failed) == (2, 1)


def test_xcresulttool_repetitions_and_failure_location_are_read():
    # Given a test case retried by -retry-tests-on-failure (a Repetition failed, then passed)
    tree = b"""{"testNodes": [{"nodeType": "Unit test bundle", "name": "AppTests", "children": [
      {"nodeType": "Test Suite", "name": "LoginTests", "children": [
        {"nodeType": "Test Case", "nodeIdentifier": "LoginTests/testLogin()", "name": "testLogin()",
         "result": "Passed", "duration": "1m 2s", "children": [
          {"nodeType": "Repetition", "name": "First Run", "result": "Failed", "children": [
            {"nodeType": "Failure Message", "name": "LoginTests.swift:42: XCTAssertTrue failed"}]},
          {"nodeType": "Repetition", "name": "Retry 1", "result": "Passed"}]}]}]}]}"""

    # When it is read
    tests, summary = merge_results([read_xcresult_json(tree, "T.xcresult")])

    # Then it is flaky, with its time and where it failed
    test = tests[0]
    assert test.id == "AppTests/LoginTests::testLogin()" and test.flaky and test.status == "passed"
    assert test.duration_sec == 62.0
    assert (test.file, test.line) == ("LoginTests.swift", 42)


def test_xcresulttool_output_that_is_not_json_is_a_warning():
    read = read_xcresult_json(b'{"testNodes": [', "build/T.xcresult")

    assert read.tests == [] and read.warnings[0].startswith(
        "build/T.xcresult:1: xcresulttool's output is not JSON"
    )


def test_a_summary_keeps_its_warnings_within_the_limit():
    reads = [read_junit(b"", f"r{n}.xml") for n in range(80)]

    _, summary = merge_results(reads)

    assert len(summary.warnings) == 50 and summary.warnings[-1] == "… and 31 more warnings"
    assert ResultsSummary.model_validate(summary.model_dump()) == summary
