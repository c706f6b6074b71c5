"""Where the CLI's commands and the benches' plumbing live (issue 17, point 5).

Given the sources of relevo_cli and bench/, when their definitions and imports are read, then
relevo_cli/main.py defines no command (each command group is a module of relevo_cli.commands,
with its rendering), no bench imports a test module, and only bench/harness.py starts the
embedded stack, wraps botocore's Endpoint or loads a function's handler.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What only the harness does: start the stack, wrap botocore's Endpoint, load a handler from its file.
HARNESS_ONLY = {"LocalStack", "Endpoint", "spec_from_file_location"}


def commands_in_main(root: Path) -> list[str]:
    tree = ast.parse((root / "cli" / "relevo_cli" / "main.py").read_text(encoding="utf-8"))
    defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    return [name for name in defined if name != "_root"]  # the root callback: --debug


def bench_imports_of_tests(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [
                f"{path.name}:{node.lineno} imports {m}"
                for m in modules
                if m == "tests" or m.startswith("tests.")
            ]
    return found


def harness_work_outside_the_harness(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "bench").glob("*.py")):
        if path.name == "harness.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = (
                node.id
                if isinstance(node, ast.Name)
                else node.attr
                if isinstance(node, ast.Attribute)
                else None
            )
            if name in HARNESS_ONLY:
                found.append(f"{path.name}:{node.lineno} uses {name}")
    return found


def test_main_only_assembles_the_cli() -> None:
    assert commands_in_main(ROOT) == []


def test_no_bench_imports_a_test_module() -> None:
    assert bench_imports_of_tests(ROOT) == []


def test_only_the_harness_starts_the_stack_records_calls_and_loads_handlers() -> None:
    assert harness_work_outside_the_harness(ROOT) == []


def json_writes_outside_the_helper(root: Path) -> list[str]:
    """Each place in the CLI's commands that prints JSON itself rather than through
    commands/common.py's print_json (which `show`, the listing helper, uses)."""
    found = []
    for path in sorted((root / "cli" / "relevo_cli" / "commands").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "dumps"
                and any(keyword.arg == "indent" for keyword in node.keywords)
                and not (path.name == "common.py")
            ):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_every_listing_prints_its_json_through_the_one_helper() -> None:
    """Issue 43: about 8 commands repeated "fetch, then --json or a rich table"; `show` does it
    once. (`relevo local status` reads no API and `project view` prints JSON alone: print_json.)"""
    # Given the CLI's command modules, Then none writes `--json` output of its own
    assert json_writes_outside_the_helper(ROOT) == []
    # and the commands that fetch a listing or a view show it with the helper
    for module, count in {
        "jobs": 2,
        "dlq": 2,
        "projects": 2,
        "queue": 1,
        "agents": 1,
        "artifacts": 1,
    }.items():
        source = (ROOT / "cli" / "relevo_cli" / "commands" / f"{module}.py").read_text(encoding="utf-8")
        assert source.count("    show(") >= count, f"{module}.py: fewer than {count} show(...)"
    assert "    show(" in (ROOT / "cli" / "relevo_cli" / "commands" / "groups.py").read_text(encoding="utf-8")
    for path in ("commands/jobs.py", "follow.py"):
        lines = len((ROOT / "cli" / "relevo_cli" / path).read_text(encoding="utf-8").splitlines())
        assert lines < 470, f"{path}: {lines} lines"
