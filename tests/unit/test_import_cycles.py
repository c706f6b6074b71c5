"""No import circle anywhere in the project (issue 31): a module that imports another, directly or
through others, is never imported back by it, so every module can be read, tested and moved after
the ones it builds on.

Given every module of the project's packages (relevo_core, relevo_agent, relevo_cli, relevo_local,
relevo_tools) and every function handler, when their module-level imports are read from source
(`from pkg import module` counts as importing that module; an import inside a function, made at
call time, does not; one under `if TYPE_CHECKING:` does, since it is a dependency all the same),
then the import graph has no circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Each package's import root: the folder its top-level package sits in.
PACKAGES = {
    "relevo_core": ROOT / "layers" / "core",
    "relevo_agent": ROOT / "agent",
    "relevo_cli": ROOT / "cli",
    "relevo_local": ROOT / "local",
    "relevo_tools": ROOT / "tools",
}


def _modules() -> dict[str, Path]:
    found = {}
    for package, root in PACKAGES.items():
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((ROOT / "functions").glob("*/*.py")):
        found[f"functions.{path.parent.name}.{path.stem}"] = path
    return found


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """Statements run when the module is imported: its body, and the bodies of the if / try /
    with blocks in it, never a function's or a class's body."""
    pending, found = list(tree.body), []
    while pending:
        node = pending.pop(0)
        found.append(node)
        for block in ("body", "orelse", "finalbody"):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                pending += getattr(node, block, [])
        pending += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports at module level."""
    is_package = path.name == "__init__.py"
    targets = set()
    for node in _module_level(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, up level - 1
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                # `from pkg import module` imports that module; `from module import name`, the module.
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {target for target in targets if target in modules and target != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm,
    iterative, so a deep chain of imports cannot overflow the stack)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_the_circle_finder_finds_a_circle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a"}}
    assert circles(graph) == [{"a", "b", "c"}]


def test_the_graph_reads_every_package() -> None:
    graph = import_graph()
    assert {name.split(".")[0] for name in graph} == {*PACKAGES, "functions"}
    assert "relevo_core.notify.outbound" in graph["relevo_core.notify.groups"]


def test_no_import_circle_in_the_project() -> None:
    found = [sorted(circle) for circle in circles(import_graph())]
    assert found == [], "import circles (each module imports the next, the last the first):\n" + "\n".join(
        " -> ".join(circle) for circle in found
    )
