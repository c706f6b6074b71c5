"""The core's import graph: execution plumbing has one home, relevo_core/execution.py.

Given every module of relevo_core and every function handler, when their imports and AWS clients
are read from source, then no module takes execution plumbing (starting, stopping, naming and
describing executions, answering their task tokens, work-queue URLs, execution input) from a
sibling, and only execution.py makes Step Functions or SQS calls.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "layers" / "core" / "relevo_core"
EXECUTION = CORE / "execution.py"
HOME = "relevo_core.execution"

# What "execution plumbing" is, named here so a move cannot quietly shrink it.
PLUMBING = {
    "start_execution",
    "start_job_execution",
    "stop_execution",
    "execution_arn",
    "execution_status",
    "execution_history",
    "execution_input",
    "lock_wait",
    "gate_wait",
    "work_queue_url",
    "succeed_task",
    "fail_task",
    "TaskGone",
}
# Services whose calls for an execution belong in execution.py.
PLUMBING_SERVICES = {"stepfunctions", "sqs"}


def _sources() -> list[Path]:
    return sorted(CORE.rglob("*.py")) + sorted((ROOT / "functions").glob("*/handler.py"))


def _module(path: Path) -> str:
    if path.is_relative_to(CORE):
        parts = path.relative_to(CORE.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return f"functions.{path.parent.name}.handler"


def _sideways_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("relevo_core"):
            for alias in node.names:
                if alias.name in PLUMBING and node.module != HOME:
                    found.append(f"{_module(path)}:{node.lineno} imports {alias.name} from {node.module}")
    return found


def _plumbing_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "client"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in PLUMBING_SERVICES
        ):
            found.append(f"{_module(path)}:{node.lineno} calls client({node.args[0].value!r})")
    return found


def test_execution_module_defines_all_plumbing() -> None:
    tree = ast.parse(EXECUTION.read_text(encoding="utf-8"))
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert PLUMBING <= defined, f"missing from execution.py: {sorted(PLUMBING - defined)}"


def test_no_module_takes_execution_plumbing_from_a_sibling() -> None:
    sideways = [found for path in _sources() for found in _sideways_imports(path)]
    assert sideways == [], "execution plumbing comes from relevo_core.execution only:\n" + "\n".join(sideways)


def test_only_the_execution_module_calls_step_functions_or_sqs() -> None:
    calls = [found for path in _sources() if path != EXECUTION for found in _plumbing_calls(path)]
    assert calls == [], "Step Functions and SQS calls belong in relevo_core/execution.py:\n" + "\n".join(
        calls
    )
