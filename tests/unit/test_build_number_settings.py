"""A project's build_number settings refused when they cannot hold, naming what is wrong."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relevo_core.models.project import Project

BASE = {
    "id": "ios-app",
    "repo": "acme/ios-app",
    "region_affinity": "eu-west",
    "stages": [{"name": "archive", "run": "make archive"}],
}


def test_a_stage_the_project_lacks_is_refused_by_name():
    with pytest.raises(ValidationError, match="build_number.stages: upload are not stages of the project"):
        Project.model_validate({**BASE, "build_number": {"stages": ["upload"]}})


@pytest.mark.parametrize("floor", [0, -1, 2_100_000_001])
def test_a_floor_outside_what_the_stores_take_is_refused(floor):
    with pytest.raises(ValidationError, match="build_number.floor"):
        Project.model_validate({**BASE, "build_number": {"stages": ["archive"], "floor": floor}})


def test_the_settings_are_frozen_into_the_jobs_plan_unchanged():
    project = Project.model_validate({**BASE, "build_number": {"stages": ["archive"], "floor": 1200}})
    assert project.build_number is not None
    assert (project.build_number.stages, project.build_number.floor) == (("archive",), 1200)
