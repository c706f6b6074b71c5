"""The agent's import graph: what it may take from the shared core (that no agent module imports
itself back is tests/unit/test_import_cycles.py's, for every package).

Given every module of relevo_agent, when their imports are read from source, then
- every relevo_core module an agent module imports (at module level, under TYPE_CHECKING or
  lazily inside a function) is one of the core's agent surface below, and every module of that
  surface is used: a new dependency of the agent on the core is a line added here, in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent" / "relevo_agent"
CORE = ROOT / "layers" / "core" / "relevo_core"

# What the agent may use of relevo_core, and why it needs it. Named here so that a new edge from
# the agent into the core is a decision, never a side effect of a move.
AGENT_SURFACE = {
    "relevo_core.aws": "clients, call budgets, job credentials scopes, a refusal's error code",
    "relevo_core.checks": "doctor's findings, the one check record every diagnosis prints",
    "relevo_core.fleet.lease_timeline": "the lease's numbers, shared with the state machine and the drills",
    "relevo_core.files.private": "the journal's and the keychain's private files",
    "relevo_core.files.stack": "how an agent finds its stack",
    "relevo_core.files.user_written": "reading the agent's config as a user file, its mistakes said by line",
    "relevo_core.jobs.handoff_sources": "a claimed job's context: its commit and the stages it restores from",
    "relevo_core.models.agent_session": "the claim routes' request and answer",
    "relevo_core.models.job_objects": "an attempt's listing and results document, under the job's prefix",
    "relevo_core.models.test_results": "a stage's tests as read, and a sharded stage's plan",
    "relevo_core.shard_plans.check": "a shard's ran tests checked against its part of the plan",
    "relevo_core.shard_plans.listing": "the part of a test listing the shards of a stage compare",
    "relevo_core.models.capabilities": "what a Mac can run, and what a stage requires",
    "relevo_core.models.cache": "a stage's caches: their keys, where entries are stored, an entry's manifest",
    "relevo_core.models.effect": "a stage's built-in release effect, as declared",
    "relevo_core.models.checkout_plan": "where a workspace comes from (the checkout)",
    "relevo_core.models.envelope": "the job envelope a claim brings",
    "relevo_core.models.errors": "error classes and codes",
    "relevo_core.models.handoff": "manifests, outputs and their variables",
    "relevo_core.models.plan": "a stage's plan",
    "relevo_core.models.stage_tests": "a stage's declared test reports and quarantine",
    "relevo_core.test_results": "one run of a test as a reader found it, shared by the readers",
    "relevo_core.test_results.merge": "runs merged per test, flaky and quarantine, the limits cut and said",
    "relevo_core.test_results.xcresult": "xcresulttool's JSON read into test runs",
    "relevo_core.models.stage_message": "the stage message the state machine puts on the work queue",
    "relevo_core.models.status": "job, stage and queue statuses",
    "relevo_core.models.transfer": "an upload's progress",
    "relevo_core.plan_limits": "the longest failure cause a report carries (the state machine's quotas)",
    "relevo_core.store.agent_pauses": "pauses and drains",
    "relevo_core.store.agents": "the agent's presence record",
    "relevo_core.store.artifacts": "artifact and handoff records",
    "relevo_core.store.cache_entries": "cache entries: by key or prefix, written once, hits counted",
    "relevo_core.store.jobs": "the job's status, while a run token is slow to come",
    "relevo_core.store.log_chunks": "the stage's log: a chunk's size limits",
    "relevo_core.store.log_writer": "the stage's log: its writer",
    "relevo_core.store.stage_attempts": "the fenced writes of an attempt",
    "relevo_core.store.stage_claims": "letting go of a claim, and whether its run token was handed",
}


def _agent_modules() -> list[Path]:
    return sorted(AGENT.rglob("*.py"))


def _name(path: Path) -> str:
    parts = path.relative_to(AGENT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _exists(module: str) -> bool:
    """Whether `module` (relevo_core.… or relevo_agent.…) is a module or package of this tree."""
    base = CORE.parent if module.startswith("relevo_core") else AGENT.parent
    path = base.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imported(path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules `node` imports, as absolute names: `from X import y` is X.y where that is a
    module, else X; relative imports are resolved against `path`'s package."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = _name(path).split(".")
        if not _is_package(path):
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    found = []
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        found.append(candidate if _exists(candidate) else base)
    return found


def _core_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        module
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for module in _imported(path, node)
        if module == "relevo_core" or module.startswith("relevo_core.")
    }


def test_the_agent_takes_from_the_core_only_its_declared_surface() -> None:
    outside = sorted(
        f"{_name(path)} imports {module}"
        for path in _agent_modules()
        for module in _core_imports(path)
        if module not in AGENT_SURFACE
    )
    assert outside == [], (
        "the agent imports relevo_core modules outside AGENT_SURFACE (add one there, with why, if it is "
        "meant):\n" + "\n".join(outside)
    )


def test_every_module_of_the_agents_surface_is_used() -> None:
    used = {module for path in _agent_modules() for module in _core_imports(path)}
    assert sorted(set(AGENT_SURFACE) - used) == [], (
        "no agent module imports these any more: take them out of AGENT_SURFACE"
    )


def test_the_surface_names_modules_of_the_core() -> None:
    assert [module for module in AGENT_SURFACE if not _exists(module)] == []
