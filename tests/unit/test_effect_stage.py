"""A stage's built-in release effect in the project file and the job's plan (issue 44, point 2):
`effect: {kind: …}` instead of a command, its file handed on by an earlier stage, and the envelope
version an agent must know to run it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from relevo_core.models.envelope import read_envelope
from relevo_core.models.handoff import pattern_covers
from relevo_core.models.plan import StagePlan
from relevo_core.models.project import Project
from tests.unit.test_envelope import minimal_envelope

S3_EFFECT = {"kind": "s3_object", "file": "build/App.zip", "bucket": "downloads", "key": "app/App.zip"}


def _project(*stages: dict[str, Any], **extra: Any) -> Project:
    return Project.model_validate(
        {"id": "demo", "repo": "acme/app", "region_affinity": "eu-west", "stages": list(stages), **extra}
    )


def _build(**extra: Any) -> dict[str, Any]:
    return {"name": "build", "run": "make", "handoff": ["build/App.zip"], **extra}


def test_a_stage_with_an_effect_is_frozen_with_it_and_no_command() -> None:
    # Given a project whose second stage puts the file the first hands on
    project = _project(_build(), {"name": "publish", "effect": S3_EFFECT})

    # When its stages are frozen into a job's plan
    publish = project.frozen_stages()[1]

    # Then the plan carries the effect and no command, and survives the envelope's round trip
    assert publish.command is None and publish.effect is not None
    assert publish.effect.kind == "s3_object" and publish.effect.file == "build/App.zip"
    envelope = read_envelope(
        minimal_envelope(
            schema_version=7, stages=[s.model_dump(mode="json") for s in project.frozen_stages()]
        )
    )
    assert envelope.stage("publish").effect == publish.effect


@pytest.mark.parametrize("field", ["run", "effect_probe", "effect_resume"])
def test_a_stage_with_an_effect_declares_no_command_of_its_own(field: str) -> None:
    # Given a stage with an effect that also declares a command, a probe or a resume
    stage: dict[str, Any] = {"name": "publish", "effect": S3_EFFECT, field: "true"}
    if field == "effect_resume":
        stage["effect_probe"] = "true"

    # When the project is read
    with pytest.raises(ValidationError) as caught:
        _project(_build(), stage)

    # Then it is refused, naming the field the effect excludes
    message = str(caught.value)
    assert "a stage with an effect (s3_object) has no" in message
    assert (field if field != "effect_resume" else "effect_probe") in message


def test_a_stage_has_a_command_or_an_effect() -> None:
    # Given a stage with neither a run nor an effect
    # When the project is read
    with pytest.raises(ValidationError) as caught:
        _project({"name": "build"})

    # Then it is refused naming both ways
    assert "a stage needs a command (run) or a built-in effect (effect)" in str(caught.value)


def test_an_effect_is_not_fanned_out() -> None:
    # Given a stage with an effect and parallel: 2
    # When the project is read
    with pytest.raises(ValidationError) as caught:
        _project(_build(), {"name": "publish", "effect": S3_EFFECT, "parallel": 2})

    # Then it is refused: the effect happens once
    assert "is not fanned out" in str(caught.value)


def test_an_effect_file_no_earlier_stage_hands_on_is_refused() -> None:
    # Given an effect whose file no earlier stage hands on (a later one does, or none at all)
    cases = [
        (_build(handoff=["build/Other.zip"]), {"name": "publish", "effect": S3_EFFECT}),
        ({"name": "publish", "effect": S3_EFFECT}, _build()),
    ]
    for stages in cases:
        # When the project is read
        with pytest.raises(ValidationError) as caught:
            _project(*stages)

        # Then it is refused naming the file
        assert "effect.file 'build/App.zip' is handed on by no earlier stage" in str(caught.value)


@pytest.mark.parametrize(
    "pattern", ["build/App.zip", "build", "build/", "build/*.zip", "**/*.zip", "./build/**"]
)
def test_an_effect_file_handed_on_by_a_pattern_or_its_directory_is_accepted(pattern: str) -> None:
    # Given an earlier stage handing the file on by its path, its directory or a glob
    project = _project(_build(handoff=[pattern]), {"name": "publish", "effect": S3_EFFECT})

    # Then the project reads
    assert project.stages[1].effect is not None


def test_with_a_checkout_the_file_may_be_the_repositorys() -> None:
    # Given a project with a checkout and no stage handing the file on
    project = _project(
        {"name": "publish", "effect": S3_EFFECT}, checkout={"url": "https://example.com/acme/app.git"}
    )

    # Then it reads: the agent fails the stage if the file is not there when it runs
    assert project.stages[0].effect is not None


@pytest.mark.parametrize(
    ("pattern", "path", "covers"),
    [
        ("build/*.zip", "build/sub/App.zip", False),
        ("build/?pp.zip", "build/App.zip", True),
        ("b*", "build/App.zip", True),
        ("build/[AB]pp.zip", "build/App.zip", True),
        ("build/[!A]pp.zip", "build/App.zip", False),
        ("dist", "build/App.zip", False),
    ],
)
def test_pattern_covers(pattern: str, path: str, covers: bool) -> None:
    assert pattern_covers(pattern, path) is covers


def test_a_plan_with_an_effect_and_a_command_is_refused() -> None:
    # Given a frozen stage (an envelope from elsewhere) with both
    # When it is read
    with pytest.raises(ValidationError) as caught:
        StagePlan.model_validate({"name": "publish", "command": "make", "effect": S3_EFFECT})

    # Then it is refused naming the command
    assert "command: a stage with an effect (s3_object) has no command" in str(caught.value)


def test_a_stage_with_an_effect_hands_nothing_on() -> None:
    # Given a stage with an effect that declares a handoff
    # When the project is read
    with pytest.raises(ValidationError) as caught:
        _project(_build(), {"name": "publish", "effect": S3_EFFECT, "handoff": ["build"]})

    # Then it is refused: the effect makes no files
    assert "handoff: a stage with an effect (s3_object) makes no files to hand on" in str(caught.value)
