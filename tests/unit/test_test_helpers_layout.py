"""Test helpers live in tests/helpers/ (issue 17, point 6): conftest.py holds fixtures only, and no
test takes a helper from conftest.py or from the shared helpers' old home."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
OLD_HOMES = {"tests.conftest", "tests.integration.helpers", "tests.unit.stack_files"}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]


def test_no_test_imports_a_helper_from_conftest_or_an_old_home() -> None:
    found = [
        f"{path.relative_to(TESTS)} imports {module}"
        for path in TESTS.rglob("*.py")
        for module in _imports(path)
        if module in OLD_HOMES
    ]
    assert found == []


def test_conftest_defines_fixtures_only() -> None:
    tree = ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8"))
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    not_fixtures = [
        f.name for f in functions if not any("fixture" in ast.unparse(d) for d in f.decorator_list)
    ]
    assert functions and not_fixtures == []
