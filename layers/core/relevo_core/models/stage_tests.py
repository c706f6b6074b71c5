"""The test reports a stage declares (`tests:` in the project file, frozen into its StagePlan):
where its command leaves JUnit XML and Xcode result bundles, the tests its project quarantines,
and on a stage with `parallel`, `tests.plan`: the list its shards split between them
(docs/test-results.md, "The plan"). The agent reads the reports after the command
(relevo_agent.test_reports); docs/test-results.md is the reference."""

# Annotations are evaluated as written (no `from __future__ import annotations`), as in plan.py.

from datetime import date
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from relevo_core.models.handoff import path_problem
from relevo_core.models.test_results import MAX_TEST_ID_CHARS

# A stage's report globs (JUnit and xcresult each), and the tests a stage may quarantine: bounded,
# as everything frozen into a job's envelope is.
MAX_REPORT_GLOBS = 16
MAX_QUARANTINED = 200


def _report_glob(pattern: str) -> str:
    problem = path_problem(pattern, pattern=True)
    if problem:
        # path_problem speaks of handoff paths; a report glob is held to the same workspace.
        raise ValueError(f"{pattern!r} {problem.replace('handoff paths', 'report paths')}")
    return pattern


# Checked one by one, so a mistake names its own line of the project file.
ReportGlob = Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(_report_glob)]


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


class QuarantinedTest(BaseModel):
    """A test whose failure is reported but does not fail the stage, with who quarantined it and
    since when (the project file says both: it is reviewed and versioned like the rest of it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(
        min_length=1,
        max_length=MAX_TEST_ID_CHARS,
        description="The test's id as Relevo shows it: `<suite>::<name>` (JUnit's classname and test case "
        "name, e.g. `tests.test_api::test_login[admin]`).",
    )
    by: str = Field(min_length=1, max_length=128, description="Who quarantined it (a person or team).")
    since: date = Field(description="When it was quarantined (YYYY-MM-DD).")
    reason: str | None = Field(default=None, max_length=512, description="Why, e.g. an issue link.")


class StageTests(BaseModel):
    """What a stage's tests leave and how Relevo reads it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    junit: tuple[ReportGlob, ...] = Field(
        default=(),
        max_length=MAX_REPORT_GLOBS,
        description="Workspace-relative globs of JUnit XML reports (`results/**/*.xml`): pytest's "
        "--junitxml, jest-junit, go-junit-report, any runner's. Read after the command, whether it passed "
        "or failed. No absolute path, no '..'.",
    )
    xcresult: tuple[ReportGlob, ...] = Field(
        default=(),
        max_length=MAX_REPORT_GLOBS,
        description="Workspace-relative globs of Xcode result bundles (`build/*.xcresult`), read with "
        "`xcrun xcresulttool` where it exists (a warning on the stage where it does not).",
    )
    quarantine: tuple[QuarantinedTest, ...] = Field(
        default=(),
        max_length=MAX_QUARANTINED,
        description="Tests whose failure is reported but does not fail the stage: a command that failed "
        "only because of them (every failing test quarantined, every report read cleanly) ends `warning`.",
    )

    plan: TestPlanSettings | None = Field(
        default=None,
        description="On a stage with parallel: the tests its shards split by measured time, each shard given "
        "its list in $RELEVO_SHARD_TESTS and checked afterwards, from its reports, to have run each exactly "
        "once (docs/test-results.md).",
    )

    @field_validator("quarantine")
    @classmethod
    def _one_entry_per_test(cls, entries: tuple[QuarantinedTest, ...]) -> tuple[QuarantinedTest, ...]:
        seen: set[str] = set()
        for entry in entries:
            if entry.id in seen:
                raise ValueError(f"{entry.id!r} is quarantined twice; keep one entry")
            seen.add(entry.id)
        return entries

    @model_validator(mode="after")
    def _quarantine_needs_reports(self) -> "StageTests":
        if self.quarantine and not self.declared:
            raise ValueError(
                "quarantine: the stage declares no reports (junit, xcresult) to find its tests in"
            )
        if self.plan is not None and not self.declared:
            raise ValueError(
                "plan: the stage declares no reports (junit, xcresult) that say which tests its shards ran"
            )
        return self

    @property
    def declared(self) -> bool:
        return bool(self.junit or self.xcresult)

    def quarantined_ids(self) -> frozenset[str]:
        return frozenset(entry.id for entry in self.quarantine)


def check_test_plan(tests: StageTests | None, parallel: int | None) -> None:
    """A plan only on a stage with `parallel` (a matrix's shards each run one combination whole)."""
    if tests is not None and tests.plan is not None and parallel is None:
        raise ValueError(
            "tests.plan splits a stage's tests across its shards: it needs parallel (a matrix's shards "
            "each run their whole combination)"
        )
