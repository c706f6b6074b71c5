"""The test reports a stage declares (`tests:` in the project file, frozen into its StagePlan):
where its command leaves JUnit XML and Xcode result bundles, and the tests its project
quarantines. The agent reads them after the command (relevo_agent.test_reports); docs/test-results.md
is the reference."""

# Annotations are evaluated as written (no `from __future__ import annotations`), as in plan.py.

from datetime import date
from typing import Annotated

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
        return self

    @property
    def declared(self) -> bool:
        return bool(self.junit or self.xcresult)

    def quarantined_ids(self) -> frozenset[str]:
        return frozenset(entry.id for entry in self.quarantine)
