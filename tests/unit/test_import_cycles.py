"""No import circle anywhere in the project, at any depth (issues 31 and 43): a module that imports
another, directly or through others, is never imported back by it, and no package of the project
imports, through any of its modules, a package that imports it back; so every module and package
can be read, tested, installed and moved after the ones it builds on.

Given every module of the project's packages (relevo_core, relevo_agent, relevo_cli, relevo_local,
relevo_tools) and every function handler, when every import in them is read from source -- at
module level, and deferred: inside functions and methods (made at call time) or under
`if TYPE_CHECKING:` (for the type checker), each a dependency all the same; `from pkg import
module` counts as importing that module -- then the import graph of the modules has no circle,
nor has the graph of the packages.

An import made inside a function stays a dependency: deferring one never breaks a circle. Some are
deferred on purpose, so that a cold start (a Lambda container's first request, `relevo --help`)
loads less; DEFERRED lists those, each with its reason, and an entry whose import is gone or was
moved to module level fails (the list says what is, never what was). A circle through an import
inside a function says whether it is listed, and fails either way.
"""

from __future__ import annotations

import ast
import functools
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

_WEBHOOK_START = "a webhook container's first request"
_CLI_START = "the CLI starts (`relevo --help`, `relevo job list`) without"
# Imports deferred for a cold start: (importing module, imported module) -> why it waits.
DEFERRED: dict[tuple[str, str], str] = {
    ("relevo_core.intake.enqueue", "relevo_core.jobs.lineage"): (
        f"reruns only read the lineage: {_WEBHOOK_START} does not load it"
    ),
    ("relevo_core.intake.project_cache", "relevo_core.models.project"): (
        "the Project model is built by the first read that needs one, not by importing the cache"
    ),
    ("relevo_core.store.projects", "relevo_core.models.project"): (
        "get_project_document builds no model: the first read that makes a Project imports it"
    ),
    ("relevo_core.intake.webhooks.receive", "relevo_core.intake.webhooks.verified"): (
        f"refusing a delivery needs no project, payload or job model: {_WEBHOOK_START} that "
        "refuses loads none of them"
    ),
    ("relevo_core.intake.webhooks.refusals", "relevo_core.intake.webhooks.records"): (
        "a refusal is recorded once per project and minute at most: the record's model and store "
        "load for it only"
    ),
    ("relevo_core.intake.webhooks.verified", "relevo_core.intake.webhooks.github"): (
        "a container that serves GitLab never builds GitHub's payload models"
    ),
    ("relevo_core.intake.webhooks.verified", "relevo_core.intake.webhooks.gitlab"): (
        "a container that serves GitHub never builds GitLab's payload models"
    ),
    **{
        ("relevo_cli.commands.local", f"relevo_local.{module}"): (
            f"{_CLI_START} the emulator (moto, the SAM translator, cfn-lint): the `local` extra, "
            "loaded by `relevo local …` (tests/unit/test_cli_startup.py)"
        )
        for module in ("identity", "moto", "processes", "stack", "state_dir")
    },
    ("relevo_cli.commands.local", "relevo_agent.launch"): (
        f"{_CLI_START} the agent: `relevo local agent` says clearly when the `local` extra is missing"
    ),
    ("relevo_cli.preflight", "relevo_local.template"): (
        f"{_CLI_START} the emulator's template reader: only the deploy preflight reads the template"
    ),
    ("relevo_cli.reference", "relevo_agent.config"): (
        "the agent's config schema is generated in the dev venv; the operator install has no agent"
    ),
    ("relevo_cli.commands.console", "relevo_cli.console.server"): (
        f"{_CLI_START} uvicorn and the console's Starlette app: `relevo console` loads them"
    ),
    ("relevo_cli.commands.console", "relevo_cli.console.state"): (
        f"{_CLI_START} the console's state: `relevo console` loads it"
    ),
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


def _for_the_type_checker(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """Statements run when the module is imported: its body, and the bodies of the if / try /
    with blocks in it; never a function's body (a class body runs at import, its methods not),
    nor what only the type checker reads (`if TYPE_CHECKING:`)."""
    pending, found = list(tree.body), []
    while pending:
        node = pending.pop(0)
        found.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _for_the_type_checker(node):
            continue
        for block in ("body", "orelse", "finalbody"):
            pending += getattr(node, block, [])
        pending += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
    return found


def _targets(
    node: ast.Import | ast.ImportFrom, name: str, is_package: bool, modules: dict[str, Path]
) -> set[str]:
    """The project modules one import statement of module `name` imports."""
    targets = set()
    if isinstance(node, ast.Import):
        targets |= {alias.name for alias in node.names}
    else:
        base = node.module or ""
        if node.level:  # relative: from the module's own package, up level - 1
            package = name.split(".") if is_package else name.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        for alias in node.names:
            # `from pkg import module` imports that module; `from module import name`, the module.
            targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {target for target in targets if target in modules and target != name}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> dict[str, bool]:
    """The project modules `name` imports anywhere in it, each with whether every import of it
    is deferred: made inside a function (at call time) or for the type checker only."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    at_import = {id(node) for node in _module_level(tree)}
    deferred: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in _targets(node, name, path.name == "__init__.py", modules):
                deferred[target] = deferred.get(target, True) and id(node) not in at_import
    return deferred


@functools.cache
def _all_imports() -> dict[str, dict[str, bool]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def import_graph() -> dict[str, set[str]]:
    """Every import of every module, wherever in the module it is made."""
    return {name: set(targets) for name, targets in _all_imports().items()}


def deferred_imports() -> set[tuple[str, str]]:
    """(module, imported module) for each project module a module imports only inside functions
    (or for the type checker)."""
    return {
        (name, target)
        for name, targets in _all_imports().items()
        for target, deferred in targets.items()
        if deferred
    }


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The packages each package imports through any of its modules."""
    packages: dict[str, set[str]] = {name.split(".")[0]: set() for name in graph}
    for name, targets in graph.items():
        packages[name.split(".")[0]] |= {target.split(".")[0] for target in targets}
    return {package: targets - {package} for package, targets in packages.items()}


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


def _edge_words(source: str, target: str, deferred: set[tuple[str, str]]) -> str:
    if (source, target) not in deferred:
        return f"{source} -> {target}"
    listed = "listed in DEFERRED" if (source, target) in DEFERRED else "not listed in DEFERRED"
    return f"{source} -> {target} (inside a function, {listed})"


def test_the_circle_finder_finds_a_circle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a"}}
    assert circles(graph) == [{"a", "b", "c"}]


def test_the_graph_reads_every_package_and_the_imports_inside_functions() -> None:
    # Given the project's sources, when their import graph is read
    graph = import_graph()
    # Then every package is in it, with the imports made at module level
    assert {name.split(".")[0] for name in graph} == {*PACKAGES, "functions"}
    assert "relevo_core.notify.outbound" in graph["relevo_core.notify.groups"]
    # and those made inside a function, known as deferred
    assert "relevo_core.intake.webhooks.verified" in graph["relevo_core.intake.webhooks.receive"]
    assert (
        "relevo_core.intake.webhooks.receive",
        "relevo_core.intake.webhooks.verified",
    ) in deferred_imports()
    assert ("relevo_core.notify.groups", "relevo_core.notify.outbound") not in deferred_imports()


def test_the_package_graph_joins_the_modules_of_each_package() -> None:
    graph = {"p.a": {"q.b"}, "q.b": {"q.c"}, "q.c": {"p.d"}, "p.d": set(), "r.e": {"p.a"}}
    assert package_graph(graph) == {"p": {"q"}, "q": {"p"}, "r": {"p"}}
    assert circles(package_graph(graph)) == [{"p", "q"}]


def test_no_import_circle_in_the_project_at_any_depth() -> None:
    # Given every import of every module, inside functions too
    graph, deferred = import_graph(), deferred_imports()
    # When its circles are found, then there is none
    found = [sorted(circle) for circle in circles(graph)]
    lines = []
    for circle in found:
        members = set(circle)
        lines.append("circle: " + ", ".join(circle))
        lines += [
            "  " + _edge_words(source, target, deferred)
            for source in circle
            for target in sorted(graph[source] & members)
        ]
    assert found == [], "import circles (each module reaches the others):\n" + "\n".join(lines)


def test_no_package_imports_a_package_that_imports_it() -> None:
    # Given the packages each package imports through any of its modules, at any depth
    graph = import_graph()
    packages = package_graph(graph)
    # When their circles are found, then there is none; each import across the circle is named
    found = [sorted(circle) for circle in circles(packages)]
    deferred = deferred_imports()
    lines = [
        "  " + _edge_words(source, target, deferred)
        for circle in found
        for source in sorted(graph)
        if source.split(".")[0] in circle
        for target in sorted(graph[source])
        if target.split(".")[0] in circle and target.split(".")[0] != source.split(".")[0]
    ]
    assert found == [], f"package circles {found}:\n" + "\n".join(lines)


def test_every_listed_deferral_is_an_import_inside_a_function_today() -> None:
    # Given the imports made only inside functions
    deferred = deferred_imports()
    # Then each DEFERRED entry is one of them, with its reason (a stale entry fails)
    stale = sorted(set(DEFERRED) - deferred)
    assert stale == [], f"DEFERRED names imports that are not (or no longer) deferred: {stale}"
    assert all(reason.strip() for reason in DEFERRED.values())
