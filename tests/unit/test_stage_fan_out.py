"""A stage's fan-out in the project file: `parallel` or `matrix`, never both, each shard's
environment, and `fail_fast` / `max_parallel` only where there is a fan-out."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from relevo_core.models.handoff import output_variable
from relevo_core.models.project import Project

BASE = {"id": "app", "repo": "acme/app", "region_affinity": "eu-west"}


def stage(**fields: Any) -> Project:
    return Project.model_validate({**BASE, "stages": [{"name": "test", "run": "make test", **fields}]})


def test_parallel_gives_each_shard_its_index_and_the_count():
    (plan,) = stage(parallel=4).frozen_stages()

    assert [shard.environment() for shard in plan.shards()] == [
        {"RELEVO_SHARD_INDEX": str(index), "RELEVO_SHARD_COUNT": "4"} for index in range(4)
    ]
    assert plan.stops_siblings and plan.shard_count == 4


def test_a_matrix_runs_one_shard_per_combination_the_first_key_varying_slowest():
    (plan,) = stage(
        matrix={"device": ["iPhone 16", "iPad Air"], "os": ["18.2", "17.5"]}, fail_fast=False, max_parallel=2
    ).frozen_stages()

    shards = plan.shards()
    assert [shard.matrix for shard in shards] == [
        {"device": "iPhone 16", "os": "18.2"},
        {"device": "iPhone 16", "os": "17.5"},
        {"device": "iPad Air", "os": "18.2"},
        {"device": "iPad Air", "os": "17.5"},
    ]
    assert shards[2].environment() == {
        "RELEVO_SHARD_INDEX": "2",
        "RELEVO_SHARD_COUNT": "4",
        "RELEVO_MATRIX_DEVICE": "iPad Air",
        "RELEVO_MATRIX_OS": "18.2",
    }
    assert shards[2].label == "device=iPad Air, os=18.2"
    assert not plan.stops_siblings and plan.max_parallel == 2


def test_a_stage_without_a_fan_out_is_one_run():
    (plan,) = stage().frozen_stages()

    assert (plan.sharded, plan.shard_count) == (False, 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"parallel": 2, "matrix": {"os": ["18.2"]}}, "parallel and matrix are exclusive"),
        ({"fail_fast": False}, "fail_fast apply to a stage with parallel or matrix"),
        ({"max_parallel": 2}, "max_parallel apply to a stage with parallel or matrix"),
        ({"matrix": {}}, "matrix: name at least one key"),
        ({"matrix": {"os": []}}, "matrix.os: no values"),
        ({"matrix": {"os": ["18.2", "18.2"]}}, "matrix.os value names must be unique, repeated: 18.2"),
        ({"matrix": {"OS": ["18.2"]}}, "String should match pattern"),
        ({"parallel": 1}, "greater than or equal to 2"),
    ],
    ids=[
        "both",
        "fail_fast alone",
        "max_parallel alone",
        "empty matrix",
        "key without values",
        "repeated value",
        "key case",
        "one shard",
    ],
)
def test_a_fan_out_that_makes_no_sense_is_refused_with_one_line_saying_why(fields, message):
    with pytest.raises(ValidationError) as refused:
        stage(**fields)

    assert message in str(refused.value)


def test_a_stage_with_shards_hands_files_on_and_each_shard_names_its_values():
    (plan,) = stage(parallel=3, handoff=["results/"]).frozen_stages()

    assert plan.handoff == ("results/",) and plan.shard_count == 3
    assert [output_variable(plan.name, "passed", shard) for shard in range(3)] == [
        "RELEVO_OUT_TEST_SHARD0_PASSED",
        "RELEVO_OUT_TEST_SHARD1_PASSED",
        "RELEVO_OUT_TEST_SHARD2_PASSED",
    ]
    assert output_variable("sign-app", "digest") == "RELEVO_OUT_SIGN_APP_DIGEST"


def test_a_stage_named_like_a_shard_of_another_is_refused_naming_both():
    with pytest.raises(ValidationError) as refused:
        Project.model_validate(
            {
                **BASE,
                "stages": [
                    {"name": "test", "run": "make test", "parallel": 2},
                    {"name": "test_shard1", "run": "true"},
                ],
            }
        )

    assert (
        "stages test and test_shard1 would both hand on their values as RELEVO_OUT_TEST_SHARD1_…: rename one"
        in str(refused.value)
    )
