"""A real peer's test suite sharded by Relevo (docs/test-results.md): more-itertools 10.7.0's own
tests (relevo_local.peer_suite) as a stage of shards with a test plan, and what a job of it
says -- every test accounted for through the API, and how well the split balanced the shards.

The stage copies the unpacked sdist into its workspace, lists the tests with
`pytest --collect-only -q` (the plan) and runs its part (`pytest @$RELEVO_SHARD_TESTS`: one node
id a line, as pytest reads an argument file) with a JUnit report Relevo reads and checks. The
e2e test (tests/e2e/test_peer_suite.py), `make bench` (bench/parallel.py) and `make demo` run it.
"""

from __future__ import annotations

import shlex
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHARDS = 4
# The split's target: the slowest shard within this of the mean of the shards, or -- on a suite
# one of whose tests is longer than that mean -- of the best a split of whole tests can do.
BALANCE_TARGET = 1.15
REPORT = "results/junit.xml"


def pytest_command(config: str = "pyproject.toml", deselect: tuple[str, ...] = ()) -> str:
    """pytest with the suite's configuration file `config`, less the node ids that start with a
    `deselect` prefix. pytest-randomly (where installed) would list the tests in another order on
    each shard: the shards' listings would differ, and Relevo refuses a listing other than the
    plan's. `-c`: the suite's own configuration, never one pytest would find in a directory above
    the workspace."""
    left_out = "".join(f" --deselect {shlex.quote(prefix)}" for prefix in deselect)
    python = shlex.quote(sys.executable)
    return f"{python} -m pytest -c {shlex.quote(config)} -p no:cacheprovider -p no:randomly{left_out}"


def shard_stage(
    suite: Path,
    *,
    name: str = "test",
    shards: int = SHARDS,
    paths: tuple[str, ...] = (),
    drop_first_in_shard: int | None = None,
    dropped_to: Path | None = None,
    cut_report_in_shard: int | None = None,
    config: str = "pyproject.toml",
    deselect: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The project stage: `shards` shards of the suite's tests (of `paths` only, when given, less
    the node ids starting with a `deselect` prefix), run with the suite's pytest configuration
    file `config`.
    `drop_first_in_shard`: that shard runs its list less its first test (written to
    `dropped_to`), as a runner that skips a test it was given would; `cut_report_in_shard`: that
    shard's report is cut halfway, as a runner killed while writing it would leave it."""
    copy = f"cp -R {shlex.quote(str(suite))}/. ."
    pytest = pytest_command(config, deselect)
    listed = " ".join(shlex.quote(path) for path in paths)
    steps = ["set -e", copy, f"rm -rf {shlex.quote(REPORT.split('/')[0])}", 'tests="$RELEVO_SHARD_TESTS"']
    if drop_first_in_shard is not None:
        assert dropped_to is not None
        steps.append(
            f'if [ "$RELEVO_SHARD_INDEX" = {drop_first_in_shard} ]; then '
            f'head -n 1 "$tests" > {shlex.quote(str(dropped_to))}; tail -n +2 "$tests" > .shard-tests; '
            "tests=.shard-tests; fi"
        )
    steps.append(f'{pytest} -q @"$tests" --junitxml={REPORT}')
    if cut_report_in_shard is not None:
        steps.append(
            f'if [ "$RELEVO_SHARD_INDEX" = {cut_report_in_shard} ]; then '
            f'head -c "$(( $(wc -c < {REPORT}) / 2 ))" {REPORT} > .cut.xml; mv .cut.xml {REPORT}; fi'
        )
    return {
        "name": name,
        "run": "; ".join(steps),
        "parallel": shards,
        "tests": {
            "junit": [REPORT],
            "plan": {
                "command": f"{copy} && {pytest} --collect-only -q {listed}".rstrip(),
                "format": "pytest",
            },
        },
    }


def all_tests(api: Any, job_id: str, limit: int = 500) -> list[dict[str, Any]]:
    """Every test of the job as GET /jobs/{id}/tests pages them."""
    tests: list[dict[str, Any]] = []
    token = None
    while True:
        page = api.job_tests(job_id, limit=limit, page_token=token)
        tests += page["tests"]
        token = page.get("next_page_token")
        if not token:
            return tests


def accounted(tests: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(each test id once, the ids listed more than once)."""
    counts = Counter(test["id"] for test in tests)
    return sorted(counts), sorted(test_id for test_id, count in counts.items() if count > 1)


@dataclass(frozen=True)
class Balance:
    """How a job's split balanced its shards: the plan's expected seconds a shard, the shards'
    measured seconds (their tests' time, from their results), the job's longest test."""

    by: str
    history_jobs: int
    expected: list[float]
    measured: list[float]
    longest_test: float

    @property
    def mean(self) -> float:
        return statistics.fmean(self.measured)

    @property
    def slowest_to_mean(self) -> float:
        return max(self.measured) / self.mean

    @property
    def best_possible(self) -> float:
        """No split of whole tests has a shard faster than the mean, or than its longest test."""
        return max(self.mean, self.longest_test)

    @property
    def slowest_to_best(self) -> float:
        return max(self.measured) / self.best_possible

    def said(self) -> str:
        shown = " / ".join(f"{seconds:.2f}" for seconds in self.measured)
        expected = " / ".join(f"{seconds:.2f}" for seconds in self.expected)
        return (
            f"split by {self.by} ({self.history_jobs} earlier jobs): shards {shown} s (expected {expected}), "
            f"slowest / mean {self.slowest_to_mean:.2f}, longest test {self.longest_test:.2f} s, "
            f"slowest / best possible {self.slowest_to_best:.2f}"
        )


def balance(api: Any, job: dict[str, Any], stage: str = "test") -> Balance:
    """The split of the job's `stage` (`job`: the job as GET /jobs/{id} shows it)."""
    view = next(s for s in job["stages"] if s["name"] == stage)
    plan = view["test_plan"]
    slowest = api.job_tests(job["job_id"], limit=1, slowest=1)["slowest"]
    return Balance(
        by=plan["by"],
        history_jobs=plan["history_jobs"],
        expected=[float(part["expected_sec"]) for part in plan["shards"]],
        measured=[float(shard["tests"]["duration_sec"]) for shard in view["shards"]],
        longest_test=float(slowest[0]["duration_sec"]) if slowest else 0.0,
    )
