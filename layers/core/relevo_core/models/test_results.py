"""What a stage's tests did, as Relevo reads and keeps it (docs/test-results.md): the reports a
stage declares (JUnit XML from any runner, Xcode result bundles through `xcrun xcresulttool`),
read by the agent after the command into one results document per attempt, stored under the
job's prefix beside its handoff (`.relevo-tests/`), with the counts on the stage's (or shard's)
record.

A test has one id across the listing that plans a sharded stage and the reports its shards
write: `<suite>::<name>`, where the suite is JUnit's `classname` (or the Xcode target and class,
`Target/Class`) and the name is the test case's own, parameters included. `canonical_test_id`
gives it from a report's two fields, `pytest_node_id` from a pytest node id (`--collect-only
-q`), so that the plan and the results meet on the same string."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# A results document's shape; a reader refuses a later one it does not know.
RESULTS_SCHEMA = 1
# Where an attempt's results document is, under the job's prefix (relevo_core.models.job_objects).
TESTS_DIR = ".relevo-tests"

# Limits (docs/test-results.md, "Limits"): a report file over MAX_REPORT_BYTES is read up to it
# and the cut said; a stage's tests past MAX_TESTS are dropped with the cut said (counted, never
# silently); a failure's message is kept to MAX_MESSAGE_CHARS, a test id to MAX_TEST_ID_CHARS.
MAX_REPORT_BYTES = 64 * 1024 * 1024
MAX_REPORTS = 1_000
MAX_TESTS = 100_000
MAX_MESSAGE_CHARS = 4_096
MAX_TEST_ID_CHARS = 1_024
MAX_WARNINGS = 50

TestStatus = Literal["passed", "failed", "error", "skipped"]
# What fails a stage (a quarantined test's failure does not; a flaky test passed in the end).
FAILING: frozenset[str] = frozenset({"failed", "error"})


def canonical_test_id(suite: str, name: str) -> str:
    """A test's id: `<suite>::<name>` (a report's classname and test case name as written)."""
    return f"{suite}::{name}" if suite else name


def pytest_node_id(node_id: str) -> str:
    """The canonical id of a pytest node id as `pytest --collect-only -q` prints it
    (`tests/test_x.py::TestA::test_b[p/q]`), equal to the id of the same test in pytest's JUnit
    report (classname `tests.test_x.TestA`, name `test_b[p/q]`). Made as pytest's junitxml makes
    its classname (`mangle_test_address`): the parameters (from the first `[`) set aside, the rest
    split on `::`, the file part's slashes made dots and its `.py` dropped, the last part the name
    with its parameters back -- a parameter holding `::` or `/` stays whole, as in the report."""
    path, bracket, params = node_id.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".").removesuffix(".py")
    return canonical_test_id(".".join(names[:-1]), names[-1] + bracket + params)


class TestResult(BaseModel):
    """One test as a stage's reports say it ran (of one attempt of one stage or shard)."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(max_length=MAX_TEST_ID_CHARS, description="`<suite>::<name>` (canonical_test_id)")
    suite: str = Field("", description="JUnit's classname, or the Xcode target and class")
    name: str = Field(description="the test case's name, parameters included")
    status: TestStatus = Field(description="how it ended in the end (its last run)")
    duration_sec: float = Field(0.0, ge=0, description="its runs' time together, seconds")
    file: str | None = Field(
        None, description="the source file, relative to the workspace, when the report says"
    )
    line: int | None = Field(None, ge=1, description="the line, when the report says")
    message: str | None = Field(
        None, max_length=MAX_MESSAGE_CHARS, description="a failure's or skip's message, first line first"
    )
    # Every run of it in order, the last deciding `status`: a runner's reruns in one report
    # (pytest-rerunfailures, Jest's retryTimes, xcodebuild -retry-tests-on-failure), then a
    # retry of the shard adds its runs after the earlier attempt's.
    runs: list[TestStatus] = Field(default_factory=list)
    flaky: bool = Field(False, description="it failed, then passed in a rerun or a retry of its shard")
    quarantined: bool = Field(
        False, description="named by the project's quarantine: run, reported, not failing"
    )
    report: str | None = Field(
        None, description="the report file it was read from, relative to the workspace"
    )


class ResultsSummary(BaseModel):
    """An attempt's tests counted: kept on the stage's (or shard's) record and in the job view."""

    model_config = ConfigDict(frozen=True)

    total: int = 0
    passed: int = 0
    failed: int = 0
    error: int = 0
    skipped: int = 0
    flaky: int = 0
    quarantined: int = 0
    duration_sec: float = 0.0
    reports: int = Field(0, description="report files read")
    # Said, never silent: a malformed or truncated report ("results/a.xml:12: …"), a cut.
    warnings: list[str] = Field(default_factory=list, max_length=MAX_WARNINGS)
    cut: bool = Field(
        False, description="a limit was met: some tests or bytes were not read (warnings say which)"
    )
    # The results document (its key under the job's prefix, and its sha256 as stored).
    results_key: str | None = None
    sha256: str | None = None


class ResultsDocument(BaseModel):
    """The results document of one attempt: stored as JSON at results_key (job_objects)."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = RESULTS_SCHEMA
    job_id: str
    stage: str
    shard: int | None = None
    attempt: int = Field(ge=1)
    agent_id: str
    summary: ResultsSummary
    tests: list[TestResult]


class PlannedTest(BaseModel):
    """A test of a sharded stage's plan: its canonical id, and the id as the listing wrote it
    (what the shard's runner is given in $RELEVO_SHARD_TESTS)."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(max_length=MAX_TEST_ID_CHARS)
    listed: str = Field(max_length=MAX_TEST_ID_CHARS)
    expected_sec: float = Field(0.0, ge=0, description="from earlier jobs, or the median when it has none")


class ShardPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    shard: int = Field(ge=0)
    tests: list[PlannedTest]
    expected_sec: float = Field(0.0, ge=0, description="its tests' expected time together")


class TestPlan(BaseModel):
    """A sharded stage's tests split across its shards: made once per stage of a job (the first
    shard to ask writes it, conditionally; the others read it), recorded on the job, checked
    after the shards ran: every planned test ran exactly once, none lost, none twice, none
    unplanned."""

    model_config = ConfigDict(frozen=True)

    stage: str
    listing_sha256: str = Field(description="of the listing the plan was made from")
    shards: list[ShardPlan]
    by: Literal["time", "count"] = Field(description="split by measured time, or by count (no history)")
    history_jobs: int = Field(0, ge=0, description="earlier jobs whose durations the split used")
    allow_empty: bool = Field(False, description="a shard with no tests passes (the plan says so)")
