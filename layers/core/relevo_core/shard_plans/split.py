"""A sharded stage's tests split across its shards, the slowest shard as short as it can be.

Longest processing time first (LPT): the tests by expected time, longest first, each given to the
shard with the least expected time so far. Chosen because it is simple, deterministic and good:
its slowest shard is within 4/3 of the best split there is (Graham, 1969), and with hundreds of
tests, whose times are small beside a shard's total, it ends within a test's time of the mean --
the long tests placed first, the many short ones fill the gaps. An exact split (a bin-packing
search) is NP-hard and would gain a few per cent at best, on durations that vary more than that
from run to run.

Expected times come from the project's earlier jobs of the stage (their results documents): a
test's low median over the jobs that ran it (the median of an odd count, the lower middle one of an
even count, so the lesser of two). Not the mean: a test often pays a one-off cost in one job and
not the next -- the first test of a shard to load a grammar, boot a simulator or fill a cache is
charged for it, and every shard pays that cost once whichever test it is charged to, so it does not
belong to the test; and the split moves which test that is from one job to the next (parso's
grammar loads, 0.2-0.5 s each, moved between tests that otherwise take milliseconds). A test with
no history gets the median of those that have one.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from statistics import median, median_low

from relevo_core.models.test_results import PlannedTest, ShardPlan, TestPlan, TestResult

# How many earlier jobs of the stage the split reads durations from (the latest that have them).
HISTORY_JOBS = 5


def job_durations(tests: Iterable[TestResult]) -> dict[str, float]:
    """One job's durations per test id (its shards' results together; a test in two shards'
    results -- a retry moved it -- keeps its longest)."""
    durations: dict[str, float] = {}
    for test in tests:
        durations[test.id] = max(durations.get(test.id, 0.0), test.duration_sec)
    return durations


def expected_durations(
    tests: list[PlannedTest], history: Sequence[Mapping[str, float]]
) -> tuple[dict[str, float], int]:
    """Each planned test's expected seconds (its low median over the jobs that ran it, else the
    median of the others'), and how many jobs' durations were used. ({}, 0) without history."""
    jobs = [durations for durations in history if durations]
    if not jobs:
        return {}, 0
    known: dict[str, float] = {}
    for test in tests:
        seen = [durations[test.id] for durations in jobs if test.id in durations]
        if seen:
            known[test.id] = median_low(seen)
    if not known:
        return {}, len(jobs)
    fill = median(known.values())
    return {test.id: known.get(test.id, fill) for test in tests}, len(jobs)


def split_tests(
    stage: str,
    tests: list[PlannedTest],
    shards: int,
    listing_sha256: str,
    history: Sequence[Mapping[str, float]],
    allow_empty: bool = False,
) -> TestPlan:
    """The plan: every listed test in exactly one shard, each shard's tests in listing order."""
    if shards < 1:
        raise ValueError("a plan needs at least one shard")
    expected, jobs = expected_durations(tests, history)
    assigned: list[list[int]] = [[] for _ in range(shards)]
    if expected:
        by = "time"
        # Longest first; the listing's order breaks ties, the lowest shard takes a tie of loads.
        order = sorted(range(len(tests)), key=lambda i: (-expected[tests[i].id], i))
        loads = [(0.0, shard) for shard in range(shards)]
        for i in order:
            load, shard = heapq.heappop(loads)
            assigned[shard].append(i)
            heapq.heappush(loads, (load + expected[tests[i].id], shard))
    else:
        by = "count"
        for i in range(len(tests)):
            assigned[i % shards].append(i)
    plans = []
    for shard, indices in enumerate(assigned):
        planned = [
            tests[i].model_copy(update={"expected_sec": round(expected.get(tests[i].id, 0.0), 3)})
            for i in sorted(indices)
        ]
        total = round(sum(expected.get(test.id, 0.0) for test in planned), 3)
        plans.append(ShardPlan(shard=shard, tests=planned, expected_sec=total))
    return TestPlan(
        stage=stage,
        listing_sha256=listing_sha256,
        shards=plans,
        by=by,
        history_jobs=jobs,
        allow_empty=allow_empty,
    )
