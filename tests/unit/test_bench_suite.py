"""The suite's own time in `make bench`'s table (issue 47, point 4): a run of the whole suite
records its wall time and what it ran on (tests/helpers/xdist_workers.py), bench/suite.py reads the
record, and only a passing run on 2 CPUs within 600 s meets "make test under 10 minutes on CI's
2 cores"; a selection of tests is never recorded as the suite."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import harness, suite
from tests.helpers import xdist_workers


def _record(**changes) -> dict:
    record = {
        "wall_sec": 512.4,
        "exit_status": 0,
        "counts": {"passed": 2480, "failed": 0, "error": 0, "skipped": 7},
        "workers": 3,
        "cpus": 2,
        "cpus_how": "CPU affinity",
        "cpu_count": 2,
        "host": "ci-runner",
        "commit": "abc1234",
        "finished_at": "2026-12-06T14:00:00+00:00",
        "longest_groups": {"browser": 301.2, "e2e-drill": 180.0},
    }
    return {**record, **changes}


def _report_of(record_file: Path, monkeypatch, tmp_path: Path) -> tuple[int, dict]:
    figures = tmp_path / "figures.jsonl"
    monkeypatch.setenv(harness.SUMMARY_FILE_ENV, str(figures))
    code = suite.main(["--record", str(record_file)])
    (line,) = figures.read_text().splitlines()
    return code, json.loads(line)


def test_a_passing_run_on_2_cpus_within_600_s_meets_the_target_and_names_its_host(
    tmp_path: Path, monkeypatch
) -> None:
    # Given the record of a whole-suite run of 512 s on 2 CPUs that passed
    record_file = tmp_path / "suite-time.json"
    record_file.write_text(json.dumps(_record()))
    # When make bench's suite bench reads it
    code, figure = _report_of(record_file, monkeypatch, tmp_path)
    # Then the row is met, with the figure and where it was measured
    assert code == 0
    assert (figure["bench"], figure["figure"], figure["target"], figure["ok"]) == (
        "suite",
        "make test on this host",
        "<= 600 s on 2 cores",
        True,
    )
    assert figure["value"] == 512.4
    assert figure["shown"] == "512 s (3 workers on 2 CPUs of ci-runner, abc1234)"


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"wall_sec": 807.0}, "807 s (3 workers on 2 CPUs of ci-runner, abc1234)"),
        (
            {"exit_status": 1, "counts": {"passed": 2479, "failed": 1}},
            "512 s (3 workers on 2 CPUs of ci-runner, abc1234), 1 failed",
        ),
        (
            {"cpus": 8, "workers": 9},
            "512 s (9 workers on 8 CPUs of ci-runner, abc1234): not 2 CPUs (taskset -c 0,1 make test)",
        ),
    ],
    ids=["over 600 s", "a failed run", "more than 2 CPUs"],
)
def test_a_slow_failed_or_larger_host_run_misses_and_says_why(
    tmp_path: Path, monkeypatch, changes: dict, said: str
) -> None:
    # Given a record that does not show the suite within 600 s on 2 cores
    record_file = tmp_path / "suite-time.json"
    record_file.write_text(json.dumps(_record(**changes)))
    # When it is read
    code, figure = _report_of(record_file, monkeypatch, tmp_path)
    # Then the row is missed, and says why
    assert code == 1
    assert (figure["shown"], figure["ok"]) == (said, False)


def test_no_recorded_run_is_a_miss_that_says_to_run_make_test(tmp_path: Path, monkeypatch) -> None:
    # Given a checkout where the whole suite never ran
    code, figure = _report_of(tmp_path / "absent.json", monkeypatch, tmp_path)
    # Then the row is missed, not met by default
    assert code == 1
    assert (figure["value"], figure["shown"], figure["ok"]) == (
        None,
        "no whole-suite run recorded (run make test)",
        False,
    )


def _config(args_source, keyword: str = "", markexpr: str = "") -> SimpleNamespace:
    return SimpleNamespace(
        args_source=args_source, option=SimpleNamespace(keyword=keyword, markexpr=markexpr)
    )


def test_only_a_run_of_the_whole_suite_is_recorded_as_the_suite() -> None:
    sources = pytest.Config.ArgsSource
    # `make test`: pyproject's testpaths, nothing selected away
    assert xdist_workers.is_whole_suite(_config(sources.TESTPATHS), deselected=0)
    # A file named, a -k or -m selection, or tests deselected: not the suite
    assert not xdist_workers.is_whole_suite(_config(sources.ARGS), deselected=0)
    assert not xdist_workers.is_whole_suite(_config(sources.TESTPATHS, keyword="drill"), deselected=0)
    assert not xdist_workers.is_whole_suite(_config(sources.TESTPATHS, markexpr="not e2e"), deselected=0)
    assert not xdist_workers.is_whole_suite(_config(sources.TESTPATHS), deselected=3)


def test_each_xdist_groups_seconds_add_up_its_tests_setup_call_and_teardown() -> None:
    # Given reports as xdist's loadgroup names them: "@group" at the end of a grouped test's id
    reports = [
        SimpleNamespace(nodeid="tests/browser/test_console.py::test_a@browser", duration=10.0),
        SimpleNamespace(nodeid="tests/browser/test_console.py::test_a@browser", duration=2.5),
        SimpleNamespace(nodeid="tests/e2e/test_drill.py::test_the_drill_holds[kill]@e2e-drill", duration=7.0),
        SimpleNamespace(nodeid="tests/unit/test_x.py::test_y[a@b]", duration=99.0),  # an "@" in a parameter
        SimpleNamespace(nodeid=None, duration=1.0),  # a warning's report
    ]
    # Then each group's time is the sum of its tests' phases; ungrouped tests are left out
    assert xdist_workers.group_seconds(reports) == Counter({"browser": 12.5, "e2e-drill": 7.0})


def test_the_record_says_what_the_run_ran_on() -> None:
    record = xdist_workers.suite_record(
        533.21, 0, {"passed": 10, "failed": 0}, 3, Counter({"browser": 300.0, "e2e-drill": 120.0})
    )
    cpus, how = xdist_workers._cpus_granted()
    assert (record["wall_sec"], record["exit_status"], record["workers"], record["cpus"]) == (
        533.2,
        0,
        3,
        cpus,
    )
    assert record["cpus_how"] == how and record["host"] and record["commit"]
    assert record["longest_groups"] == {"browser": 300.0, "e2e-drill": 120.0}
