"""A shard's tests as its reports say they ran, against its part of the plan: every test it was
given ran exactly once, none lost, none twice, none it was not given. Each shard checks its own
part; the plan gives every listed test to exactly one shard (split), so every shard passing its
check is every planned test run exactly once across the stage."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from relevo_core.models.errors import ErrorClass
from relevo_core.models.test_results import ShardPlan, TestResult

# How many ids a failure's cause names (the count says the rest).
NAMED_IN_CAUSE = 20


@dataclass(frozen=True)
class PlanCheck:
    """What the check found; `passed` when nothing."""

    shard: int
    planned: int
    ran: int
    missing: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    unplanned: list[str] = field(default_factory=list)
    empty: bool = False

    @property
    def passed(self) -> bool:
        return not (self.missing or self.twice or self.unplanned or self.empty)

    @property
    def error_class(self) -> ErrorClass | None:
        """Missing (or none given): TestsMissing; otherwise twice or unplanned: TestsUnplanned."""
        if self.passed:
            return None
        if self.missing or self.empty:
            return ErrorClass.TESTS_MISSING
        return ErrorClass.TESTS_UNPLANNED

    def cause(self) -> dict[str, object]:
        """The failure's cause: the counts, and the first NAMED_IN_CAUSE ids of each kind."""
        said: dict[str, object] = {"shard": self.shard, "planned": self.planned, "ran": self.ran}
        if self.empty:
            said["why"] = "the shard was given no tests to run, and the plan does not allow_empty"
        for name in ("missing", "twice", "unplanned"):
            ids: list[str] = getattr(self, name)
            if ids:
                said[name] = len(ids)
                said[f"{name}_ids"] = ids[:NAMED_IN_CAUSE]
        return said

    def message(self) -> str:
        if self.passed:
            return f"shard {self.shard}: {self.ran} of {self.planned} planned tests ran, each once"
        parts = []
        if self.empty:
            parts.append("no tests were planned for it (allow_empty is false)")
        for name, said in (("missing", "did not run"), ("twice", "ran twice"), ("unplanned", "not planned")):
            ids: list[str] = getattr(self, name)
            if ids:
                shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
                parts.append(f"{len(ids)} {said}: {shown}")
        return f"shard {self.shard}: " + "; ".join(parts)


def check_shard(plan: ShardPlan, tests: list[TestResult], allow_empty: bool = False) -> PlanCheck:
    """The shard's ran tests (one TestResult per test its reports name; a rerun inside one report
    is one test with several runs) against the tests it was given, in the plan's order."""
    counts = Counter(test.id for test in tests)
    planned = [test.id for test in plan.tests]
    given = set(planned)
    seen: set[str] = set()
    unplanned = []
    for test in tests:
        if test.id not in given and test.id not in seen:
            unplanned.append(test.id)
        seen.add(test.id)
    return PlanCheck(
        shard=plan.shard,
        planned=len(planned),
        ran=len(counts),
        missing=[test_id for test_id in planned if counts[test_id] == 0],
        twice=[test_id for test_id in planned if counts[test_id] > 1]
        + [test_id for test_id in unplanned if counts[test_id] > 1],
        unplanned=unplanned,
        empty=not planned and not allow_empty,
    )
