"""A sharded stage's tests split by the time each took in earlier jobs (relevo_core.shard_plans.
split): the slowest shard close to the mean, a test without history at the median, the same plan
every time, and by count -- said -- when there is no history at all."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from relevo_core.models.test_results import PlannedTest, pytest_node_id
from relevo_core.shard_plans.split import expected_durations, split_tests

SHA = "0" * 64


def _tests(count: int) -> list[PlannedTest]:
    return [PlannedTest(id=f"tests.test_m{i // 20}::test_{i}", listed=f"t{i}") for i in range(count)]


def _realistic(tests: list[PlannedTest], seed: int = 45) -> dict[str, float]:
    """A suite's durations as they spread in practice: most tests milliseconds (log-normal), a
    few files of slow ones, clustered together in listing order as a slow module's are."""
    rng = random.Random(seed)
    durations = {test.id: rng.lognormvariate(-4.0, 1.2) for test in tests}
    for test in tests[40:70]:  # one slow module: a position-sliced shard gets all of it
        durations[test.id] = rng.uniform(0.5, 2.5)
    return durations


def _spread(plan) -> float:
    times = [shard.expected_sec for shard in plan.shards]
    return max(times) / (sum(times) / len(times))


def test_the_time_split_keeps_the_slowest_shard_within_1_15_of_the_mean():
    # Given 671 tests (the peer suite's size) with a realistic spread, measured by two earlier jobs
    tests = _tests(671)
    first, second = _realistic(tests, 1), _realistic(tests, 2)
    # When they are split four ways
    plan = split_tests("test", tests, 4, SHA, [first, second])
    # Then the slowest shard is within 1.15x of the mean, by time, with both jobs used
    assert plan.by == "time" and plan.history_jobs == 2
    assert _spread(plan) <= 1.15, [shard.expected_sec for shard in plan.shards]
    # And every listed test is in exactly one shard, in listing order within it
    ids = [test.id for shard in plan.shards for test in shard.tests]
    assert sorted(ids) == sorted(test.id for test in tests) and len(ids) == len(set(ids))
    for shard in plan.shards:
        order = [tests.index(next(t for t in tests if t.id == p.id)) for p in shard.tests[:30]]
        assert order == sorted(order)
    # And slicing the same listing by position (what a shard index does) would not be
    positional = [tests[k * 168 : (k + 1) * 168] for k in range(4)]
    times = [sum(first[t.id] for t in part) for part in positional]
    assert max(times) / (sum(times) / 4) > 1.15


def test_a_test_without_history_is_expected_to_take_the_median():
    # Given history for three tests (1s, 2s, 10s) and a fourth, new test
    tests = _tests(4)
    history = [{tests[0].id: 1.0, tests[1].id: 2.0, tests[2].id: 10.0}]
    # When expected durations are made
    expected, jobs = expected_durations(tests, history)
    # Then the new test gets the median of the known ones, not 0 and not the mean
    assert expected[tests[3].id] == 2.0 and jobs == 1
    plan = split_tests("test", tests, 2, SHA, history)
    new = next(t for shard in plan.shards for t in shard.tests if t.id == tests[3].id)
    assert new.expected_sec == 2.0


def test_a_test_s_expected_time_is_its_low_median_over_the_jobs_that_ran_it():
    tests = _tests(2)
    history = [{tests[0].id: 1.0, tests[1].id: 4.0}, {tests[0].id: 3.0, tests[1].id: 5.0}, {}]
    expected, jobs = expected_durations(tests, history + [{tests[0].id: 2.0}])
    # the median of three; of two, the lesser
    assert expected == {tests[0].id: 2.0, tests[1].id: 4.0} and jobs == 3


def test_a_one_off_cost_one_job_charged_to_a_test_does_not_make_it_long():
    # Given a test that took 0.5 s once, as the first of its shard to load a grammar (parso's
    # test_basic_parsing[3.14]: 0.002 s, then 0.596 s when the split made it first), and 0.002 s in
    # the project's other jobs
    tests = _tests(2)
    history = [{tests[0].id: 0.002, tests[1].id: 1.0}, {tests[0].id: 0.596, tests[1].id: 1.0}]
    history += [{tests[0].id: 0.002, tests[1].id: 1.0}] * 3
    # When expected durations are made from the five jobs, or from that job and the next
    expected, jobs = expected_durations(tests, history)
    # Then it is expected at its usual time, not at the mean the one-off would give it (0.12 s)
    assert expected[tests[0].id] == 0.002 and jobs == 5
    assert expected_durations(tests, history[:2])[0][tests[0].id] == 0.002


def test_the_split_is_the_same_every_time():
    # Given the same listing and history, with ties in durations
    tests = _tests(200)
    history = [{test.id: float(i % 7) for i, test in enumerate(tests)}]
    # When it is split twice, once from a shuffled copy of the history's mapping
    shuffled = dict(sorted(history[0].items(), key=lambda _: random.Random(3).random()))
    one = split_tests("test", tests, 3, SHA, history)
    two = split_tests("test", tests, 3, SHA, [shuffled])
    # Then the plans are equal
    assert one == two


def test_no_history_splits_by_count_and_says_so():
    # Given no earlier job with results
    tests = _tests(10)
    # When the tests are split three ways
    plan = split_tests("test", tests, 3, SHA, [{}, {}])
    # Then by count (4, 3, 3), said on the plan, with no expected times
    assert plan.by == "count" and plan.history_jobs == 0
    assert [len(shard.tests) for shard in plan.shards] == [4, 3, 3]
    assert all(shard.expected_sec == 0 for shard in plan.shards)


def test_history_of_other_tests_only_is_a_split_by_count():
    # Given history that names none of the listed tests (they were all renamed)
    tests = _tests(6)
    plan = split_tests("test", tests, 2, SHA, [{"gone::test": 3.0}])
    # Then there is nothing to split by time: by count, said
    assert plan.by == "count"


def test_more_shards_than_tests_leaves_shards_empty_in_the_plan():
    plan = split_tests("test", _tests(2), 4, SHA, [], allow_empty=True)
    assert [len(shard.tests) for shard in plan.shards] == [1, 1, 0, 0] and plan.allow_empty


def test_an_xcodebuild_listing_gives_its_enabled_tests_with_the_xcode_suite():
    # Given `xcodebuild test-without-building -enumerate-tests -test-enumeration-format json
    # -test-enumeration-style flat` output, in the shape Xcode writes it (fixtures/)
    from pathlib import Path

    from relevo_core.shard_plans.listing import read_listing

    listing = (Path(__file__).parent / "fixtures" / "xcodebuild-enumerate-tests.json").read_bytes()
    # When it is read
    planned = read_listing(listing, "xcodebuild")
    # Then its enabled tests only, each `Target/Class::test()`, the listed id kept for -only-testing
    assert [(test.id, test.listed) for test in planned] == [
        ("AppTests/AppTests::testExample()", "AppTests/AppTests/testExample()"),
        ("AppTests/AppTests::testLaunchPerformance()", "AppTests/AppTests/testLaunchPerformance()"),
        ("AppTests/ObjCTests::testNoParens", "AppTests/ObjCTests/testNoParens"),
        ("AppTests::freeFunctionTest()", "AppTests/freeFunctionTest()"),
        ("AppUITests/AppUITests::testLaunch()", "AppUITests/AppUITests/testLaunch()"),
    ]


def test_an_xcodebuild_listing_with_errors_is_refused():
    import pytest

    from relevo_core.shard_plans.listing import ListingInvalid, read_listing

    with pytest.raises(ListingInvalid, match="xcodebuild reported errors"):
        read_listing(b'{"errors": ["no such scheme"], "values": []}', "xcodebuild")


def test_a_real_suite_s_measured_times_split_4_ways_within_1_15_of_the_mean():
    # Given parso 0.8.7's 1988 tests in their listing order, each with the time it took in a run of
    # the suite (its JUnit report; a few long tests -- the longest 6.6 s of 45 s -- and many short)
    recorded = json.loads(
        (Path(__file__).parent / "fixtures" / "peer_suites" / "parso-0.8.7-durations.json").read_text()
    )
    tests = [PlannedTest(id=pytest_node_id(listed), listed=listed) for listed, _ in recorded["tests"]]
    measured = {pytest_node_id(listed): seconds for listed, seconds in recorded["tests"]}
    assert len(tests) == len(measured) == 1988
    # When the next job splits it four ways by that run
    plan = split_tests("test", tests, 4, SHA, [measured])
    # Then, by those times, its slowest shard is within 1.15x of the mean of the shards
    assert plan.by == "time"
    times = [sum(measured[test.id] for test in shard.tests) for shard in plan.shards]
    assert max(times) / statistics.fmean(times) <= 1.15, times
    # And slicing the listing by position -- a shard index's quarter -- would not be
    size = -(-len(tests) // 4)
    positional = [sum(measured[test.id] for test in tests[k * size : (k + 1) * size]) for k in range(4)]
    assert max(positional) / statistics.fmean(positional) > 1.15, positional
