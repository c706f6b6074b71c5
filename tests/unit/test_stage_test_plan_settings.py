"""`tests.plan` in the project file (relevo_core.models.stage_tests): checked at `relevo project
apply` -- only on a stage with parallel, one source, a file inside the workspace -- and frozen into
the job's stage plan."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relevo_core.models.project_stage import ProjectStage

LISTING = {"command": "pytest --collect-only -q", "format": "pytest"}


def test_a_plan_on_a_stage_with_parallel_is_taken_and_defaults_to_not_allowing_empty_shards():
    stage = ProjectStage(
        name="test", run="pytest", parallel=4, tests={"junit": ["results/*.xml"], "plan": LISTING}
    )
    assert stage.tests is not None and stage.tests.plan is not None
    assert stage.tests.plan.allow_empty is False and stage.tests.plan.format == "pytest"


@pytest.mark.parametrize(
    ("stage", "said"),
    [
        ({"tests": {"junit": ["results/*.xml"], "plan": LISTING}}, "needs parallel"),
        (
            {"matrix": {"os": ["18"]}, "tests": {"junit": ["results/*.xml"], "plan": LISTING}},
            "needs parallel",
        ),
        ({"parallel": 2, "tests": {"junit": ["results/*.xml"], "plan": {"format": "lines"}}}, "one of file"),
        (
            {
                "parallel": 2,
                "tests": {
                    "junit": ["results/*.xml"],
                    "plan": {"file": "a.txt", "command": "ls", "format": "lines"},
                },
            },
            "one of file",
        ),
        (
            {
                "parallel": 2,
                "tests": {"junit": ["results/*.xml"], "plan": {"file": "../x.txt", "format": "lines"}},
            },
            "tests.plan.file",
        ),
        (
            {
                "parallel": 2,
                "tests": {"junit": ["results/*.xml"], "plan": {"file": "l.txt", "format": "junit"}},
            },
            "format",
        ),
        # With no report to say which tests ran, nothing could be checked against the plan.
        ({"parallel": 2, "tests": {"plan": LISTING}}, "declares no reports"),
    ],
)
def test_a_plan_project_apply_would_refuse_says_why(stage, said):
    with pytest.raises(ValidationError, match=said):
        ProjectStage(name="test", run="pytest", **stage)


def test_the_plan_is_frozen_into_the_job_s_stage():
    from relevo_core.models.project import Project

    project = Project.model_validate(
        {
            "id": "app",
            "repo": "acme/app",
            "region_affinity": "eu-west",
            "stages": [
                {
                    "name": "test",
                    "run": "pytest",
                    "parallel": 2,
                    "tests": {"junit": ["results/*.xml"], "plan": LISTING},
                }
            ],
        }
    )
    (frozen,) = project.frozen_stages()
    assert frozen.tests is not None and frozen.tests.plan is not None
    assert frozen.tests.plan.command == "pytest --collect-only -q"
