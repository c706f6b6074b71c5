"""What a stage declares of its tests (`tests:` in the project file, frozen into the job's
StagePlan): on a stage with `parallel`, `tests.plan`, the list its shards split between them
(docs/test-results.md, "The plan").

Annotations are evaluated as written (no `from __future__ import annotations`), as in the other
models."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relevo_core.models.handoff import path_problem

# The formats relevo_core.shard_plans.listing reads.
TestListFormat = Literal["pytest", "xcodebuild", "lines"]


class TestPlanSettings(BaseModel):
    """Where the stage's test list comes from, and how it is written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="A workspace-relative file holding the list, one an earlier stage hands on (handoff). "
        "Exclusive with command.",
    )
    command: str | None = Field(
        default=None,
        min_length=1,
        max_length=16_384,
        description="A command that prints the list on its standard output (e.g. `pytest --collect-only -q`, "
        "`xcodebuild test-without-building -enumerate-tests -test-enumeration-format json "
        "-test-enumeration-style flat …`): run by each shard's agent in the workspace, as the build user, "
        "with the stage's environment, before the stage's command. Exclusive with file.",
    )
    format: TestListFormat = Field(
        description="`pytest`: `--collect-only -q` node ids; `xcodebuild`: `-enumerate-tests` JSON "
        "(`-test-enumeration-format json`), its enabled tests; `lines`: one test id (`<suite>::<name>`) "
        "a line.",
    )
    allow_empty: bool = Field(
        default=False,
        description="A shard given no tests (or a listing of none) passes; by default it fails the stage "
        "(Relevo.Fatal.TestsMissing).",
    )

    @field_validator("file")
    @classmethod
    def _in_the_workspace(cls, file: str | None) -> str | None:
        problem = None if file is None else path_problem(file)
        if problem:
            raise ValueError(f"tests.plan.file {file!r} {problem}")
        return file

    @model_validator(mode="after")
    def _one_source(self) -> "TestPlanSettings":
        if (self.file is None) == (self.command is None):
            raise ValueError("tests.plan takes one of file (a list an earlier stage hands on) or command")
        return self


class StageTests(BaseModel):
    """A stage's `tests:`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: TestPlanSettings | None = Field(
        default=None,
        description="On a stage with parallel: the tests its shards split by measured time, each shard given "
        "its list in $RELEVO_SHARD_TESTS and checked afterwards to have run each exactly once "
        "(docs/test-results.md).",
    )


def check_test_plan(tests: StageTests | None, parallel: int | None) -> None:
    """A plan only on a stage with `parallel` (a matrix's shards each run one combination whole)."""
    if tests is not None and tests.plan is not None and parallel is None:
        raise ValueError(
            "tests.plan splits a stage's tests across its shards: it needs parallel (a matrix's shards "
            "each run their whole combination)"
        )
