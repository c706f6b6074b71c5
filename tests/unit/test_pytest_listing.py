"""A pytest listing (`pytest --collect-only -q`) read into the plan's ids, against the ids the
same tests have in the JUnit report pytest itself writes (--junitxml): both made for real, from a
suite with a class, a nested directory, and parameters holding `/` and `::`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from relevo_core.models.test_results import canonical_test_id
from relevo_core.shard_plans.listing import ListingInvalid, read_listing

SUITE = {
    "tests/test_plain.py": """
        def test_one():
            pass
    """,
    "tests/sub/test_nested.py": """
        import pytest

        class TestGroup:
            def test_in_class(self):
                pass

            @pytest.mark.parametrize("path", ["a/b", "c::d", "x y"])
            def test_param(self, path):
                pass

        @pytest.mark.parametrize("n", [1, 2])
        def test_numbers(n):
            pass
    """,
}


def _suite(root: Path) -> None:
    for path, body in SUITE.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(body))
    (root / "tests" / "sub" / "__init__.py").write_text("")
    (root / "tests" / "__init__.py").write_text("")
    (root / "pytest.ini").write_text("[pytest]\n")


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
        cwd=root,
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_a_pytest_listing_gives_the_ids_pytest_s_junit_report_gives(tmp_path):
    # Given a real suite, listed by pytest --collect-only -q and run by pytest with --junitxml
    _suite(tmp_path)
    listed = _pytest(tmp_path, "--collect-only", "-q")
    assert listed.returncode == 0, listed.stderr
    ran = _pytest(tmp_path, "-q", "--junitxml=report.xml")
    assert ran.returncode == 0, ran.stdout
    reported = [
        canonical_test_id(case.get("classname", ""), case.get("name", ""))
        for case in ElementTree.parse(tmp_path / "report.xml").iter("testcase")
    ]
    # When the listing is read as the plan reads it
    planned = read_listing(listed.stdout, "pytest")
    # Then each planned test has the id of the same test in the report, and the listed node id
    assert sorted(test.id for test in planned) == sorted(reported) and len(reported) == 7
    by_listed = {test.listed: test.id for test in planned}
    assert by_listed["tests/sub/test_nested.py::TestGroup::test_param[a/b]"] == (
        "tests.sub.test_nested.TestGroup::test_param[a/b]"
    )
    assert by_listed["tests/sub/test_nested.py::TestGroup::test_param[c::d]"] == (
        "tests.sub.test_nested.TestGroup::test_param[c::d]"
    )
    # And the listed ids are what pytest takes back to run exactly those tests
    again = _pytest(tmp_path, "-q", *[test.listed for test in planned[:3]])
    assert b"3 passed" in again.stdout


def test_a_listing_that_is_not_node_ids_is_refused_naming_the_line():
    try:
        read_listing(b"tests/test_a.py::test_x\nERROR collecting tests/test_b.py\n", "pytest")
    except ListingInvalid as invalid:
        assert "line 2" in str(invalid)
    else:
        raise AssertionError("a broken listing was read")
