"""CI runs the console's browser tests or fails: .ci/run installs Chromium and asks for them, so a
missing browser there fails the suite; elsewhere the tests skip, naming what to install."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.browser import CHROMIUM_MISSING, REQUIRE_BROWSER, no_chromium_verdict

ROOT = Path(__file__).resolve().parents[2]


def test_ci_asks_for_the_browser_tests_before_make_test() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert f"export {REQUIRE_BROWSER}=1" in script
    assert script.index(f"export {REQUIRE_BROWSER}=1") < script.index("make test")
    assert "apt-get install -y -qq chromium" in script


@pytest.mark.parametrize(("value", "verdict"), [("1", "fail"), (None, "skip"), ("0", "skip")])
def test_a_missing_chromium_fails_only_where_the_browser_tests_are_required(
    monkeypatch, value, verdict
) -> None:
    if value is None:
        monkeypatch.delenv(REQUIRE_BROWSER, raising=False)
    else:
        monkeypatch.setenv(REQUIRE_BROWSER, value)
    assert no_chromium_verdict() == verdict
    assert "apt-get install -y chromium" in CHROMIUM_MISSING
