"""A shard's ran tests against its part of the plan (relevo_core.shard_plans.check): every planned
test once; missing, twice, unplanned and empty each said, with the error class that fails the stage."""

from __future__ import annotations

from relevo_core.models import test_results
from relevo_core.models.errors import ErrorClass
from relevo_core.shard_plans.check import NAMED_IN_CAUSE, check_shard


def _plan(*ids: str, shard: int = 1) -> test_results.ShardPlan:
    return test_results.ShardPlan(shard=shard, tests=[test_results.PlannedTest(id=i, listed=i) for i in ids])


def _ran(*ids: str) -> list[test_results.TestResult]:
    return [
        test_results.TestResult(id=i, suite=i.partition("::")[0], name=i.partition("::")[2], status="passed")
        for i in ids
    ]


def test_every_planned_test_once_passes():
    check = check_shard(_plan("a::x", "a::y"), _ran("a::y", "a::x"))
    assert check.passed and check.error_class is None and check.ran == 2


def test_a_shard_that_ran_fewer_than_it_was_given_fails_tests_missing_naming_them():
    # Given a shard planned 30 tests that ran only the first
    planned = [f"s::t{i}" for i in range(30)]
    check = check_shard(_plan(*planned), _ran("s::t0"))
    # Then it fails as TestsMissing (not retryable), the count and the first ones named
    assert check.error_class is ErrorClass.TESTS_MISSING and not ErrorClass.TESTS_MISSING.retryable
    cause = check.cause()
    assert cause["missing"] == 29 and cause["missing_ids"] == planned[1 : 1 + NAMED_IN_CAUSE]
    assert "29 did not run: s::t1, s::t2" in check.message()


def test_a_test_run_twice_fails_as_unplanned_runs():
    check = check_shard(_plan("a::x", "a::y"), _ran("a::x", "a::y", "a::x"))
    assert check.twice == ["a::x"] and check.error_class is ErrorClass.TESTS_UNPLANNED


def test_a_test_the_shard_was_not_given_fails_as_unplanned():
    check = check_shard(_plan("a::x"), _ran("a::x", "b::elsewhere"))
    assert check.unplanned == ["b::elsewhere"] and check.error_class is ErrorClass.TESTS_UNPLANNED
    assert check.cause()["unplanned_ids"] == ["b::elsewhere"]


def test_a_shard_given_no_tests_fails_unless_the_plan_allows_it():
    assert check_shard(_plan(), []).error_class is ErrorClass.TESTS_MISSING
    assert check_shard(_plan(), [], allow_empty=True).passed


def test_a_shard_that_ran_nothing_of_what_it_was_given_fails_even_with_allow_empty():
    check = check_shard(_plan("a::x"), [], allow_empty=True)
    assert check.missing == ["a::x"] and check.error_class is ErrorClass.TESTS_MISSING
