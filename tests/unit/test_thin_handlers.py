"""Handlers are thin: parse, make one logic call, respond (issue 17, point 4).

Given every function's handler.py, when its source is read, then it reads no store module, calls
no AWS client and checks no permission inline (logic does that), and its `lambda_handler` is
wrapped by the one entry helper, `relevo_core.observability.lambda_entry`, and by nothing else:
one place decides what a function's log lines are correlated on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = sorted((ROOT / "functions").glob("*/handler.py"))
# What a handler may import from the core: its settings, the HTTP plumbing of a route, the entry
# helper, request/response models, and logic (the domain folders). Not the store, the AWS
# clients or execution plumbing.
NOT_FOR_HANDLERS = ("relevo_core.store", "relevo_core.aws", "relevo_core.execution")
# The permission check a route declares (`middlewares=[requires(...)]`) is fine; a check made in
# the route's body is logic.
INLINE_CHECKS = {"require", "visibility"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def test_every_function_has_a_handler() -> None:
    assert len(HANDLERS) >= 10


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda p: p.parent.name)
def test_a_handler_reads_no_store_and_calls_no_aws(handler: Path) -> None:
    tree = _tree(handler)
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    assert [m for m in imported if m.startswith(NOT_FOR_HANDLERS)] == []
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "client" not in called
    assert called & INLINE_CHECKS == set(), "permission checks belong in logic or in the route's middlewares"


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda p: p.parent.name)
def test_a_handler_enters_through_the_one_entry_helper(handler: Path) -> None:
    [entry] = [
        node
        for node in _tree(handler).body
        if isinstance(node, ast.FunctionDef) and node.name == "lambda_handler"
    ]
    decorators = [ast.unparse(d) for d in entry.decorator_list]
    assert len(decorators) == 1 and decorators[0].startswith("lambda_entry("), decorators
    assert "inject_lambda_context" not in handler.read_text(encoding="utf-8")


# Functions no API Gateway route calls. What a module imports is work at every cold start: the
# API's routing and permission plumbing (Powertools' event_handler) has no place in these.
NOT_API_FUNCTIONS = ("sweeper", "status_reporter", "schedule_trigger")


@pytest.mark.parametrize("function", NOT_API_FUNCTIONS)
def test_a_function_no_route_calls_imports_no_api_plumbing(function: str) -> None:
    import subprocess
    import sys

    probe = (
        "import handler, sys; print(sorted(m for m in sys.modules if "
        "m.startswith('aws_lambda_powertools.event_handler')))"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "TABLE_NAME": "relevo-Table",
        "PYTHONPATH": f"{ROOT / 'layers' / 'core'}:{ROOT / 'functions' / function}",
    }
    ran = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"
