"""A stage's test reports, read after its command (whether it passed or failed) and before its
handoff is stored and its ending reported: the JUnit files and Xcode result bundles its plan
declares (relevo_core.models.stage_tests), read into one results document for the attempt
(relevo_core.test_results), stored with the job's session at its key under the job's prefix
(test_results_key; the bytes checked by S3 against their MD5 as the handoff's are), its summary
riding on the outcome the agent reports (relevo_agent.ending.Ending.tests).

A retry of the stage (or shard) reads the earlier attempt's document first, so that a test that
failed there and passed here is flaky. Nothing here fails a stage: a report that cannot be read,
a bundle without xcrun, a document that cannot be stored are warnings on it, naming the file."""

from __future__ import annotations

import base64
import glob
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relevo_agent.junit import read_junit
from relevo_core.aws import client
from relevo_core.models.job_objects import JobPrefix, test_results_key
from relevo_core.models.test_results import (
    MAX_REPORT_BYTES,
    MAX_REPORTS,
    RESULTS_SCHEMA,
    ResultsDocument,
    ResultsSummary,
    TestResult,
)
from relevo_core.test_results import ReportRead
from relevo_core.test_results.merge import failed_only_in_quarantine, merge_results
from relevo_core.test_results.xcresult import read_xcresult_json

if TYPE_CHECKING:
    from relevo_agent.attempt import StageRun
    from relevo_core.models.envelope import JobEnvelope
    from relevo_core.models.plan import StagePlan
    from relevo_core.models.stage_tests import StageTests

log = logging.getLogger(__name__)

# xcresulttool on a large bundle takes seconds; a hung one must not hold the attempt's lease.
XCRESULTTOOL_TIMEOUT_SEC = 120.0
# How far back a retry looks for the document of an earlier attempt (one that died wrote none).
EARLIER_ATTEMPTS = 4


@dataclass(frozen=True)
class Attempt:
    """Which attempt the reports are of, and where its document goes."""

    artifact_uri: str
    job_id: str
    stage: str
    shard: int | None
    attempt: int
    agent_id: str


@dataclass(frozen=True)
class TestsRead:
    """The attempt's tests: the summary for its outcome (JSON), and whether its command failed
    only because of quarantined tests (every failing test quarantined, every report read cleanly)."""

    summary: dict[str, Any]
    failed_only_in_quarantine: bool
    failing_quarantined: tuple[str, ...] = ()
    # Every test the reports say ran (runs merged, with an earlier attempt's): what a shard of a
    # stage with tests.plan is checked against (relevo_agent.shard_tests.checked).
    tests: tuple[TestResult, ...] = ()

    @property
    def warnings(self) -> list[str]:
        return list(self.summary.get("warnings") or [])


def read_reports(
    declared: StageTests, workspace: Path, attempt: Attempt, emit: Callable[[str], None]
) -> TestsRead:
    """Read, merge, store: the attempt's tests (relevo_agent.execute calls it once per attempt)."""
    reads = [*_junit_reports(declared, workspace), *_xcresult_bundles(declared, workspace)]
    earlier = _earlier_tests(attempt)
    tests, summary = merge_results(reads, earlier, declared.quarantined_ids())
    if not reads:
        # Never a silent zero: a stage that declares reports and leaves none says so.
        globs = ", ".join([*declared.junit, *declared.xcresult])
        summary = summary.model_copy(update={"warnings": [f"no test report matched {globs}"]})
    document = ResultsDocument(
        schema_version=RESULTS_SCHEMA,
        job_id=attempt.job_id,
        stage=attempt.stage,
        shard=attempt.shard,
        attempt=attempt.attempt,
        agent_id=attempt.agent_id,
        summary=summary,
        tests=tests,
    )
    data = document.model_dump_json().encode()
    home = JobPrefix.of(attempt.artifact_uri)
    key = test_results_key(home, attempt.stage, attempt.shard, attempt.attempt)
    sha = hashlib.sha256(data).hexdigest()
    try:
        _store(home.bucket, key, data, sha)
        summary = summary.model_copy(update={"results_key": key, "sha256": sha})
    except Exception as exc:  # noqa: BLE001 - the tests are still counted on the stage
        log.warning("%s/%s: the results document was not stored: %s", attempt.job_id, attempt.stage, exc)
        summary = summary.model_copy(
            update={"warnings": [*summary.warnings, f"the results document was not stored ({exc})"][-50:]}
        )
    emit(_said(summary.model_dump(mode="json")))
    excused = failed_only_in_quarantine(tests, summary)
    failing = tuple(test.id for test in tests if test.quarantined and test.status in ("failed", "error"))
    return TestsRead(summary.model_dump(mode="json"), excused, failing, tuple(tests))


def _junit_reports(declared: StageTests, workspace: Path) -> list[ReportRead]:
    reads = []
    for relative in _matches(declared.junit, workspace, directories=False):
        path = workspace / relative
        with path.open("rb") as report:
            data = report.read(MAX_REPORT_BYTES + 1)
        truncated = len(data) > MAX_REPORT_BYTES
        reads.append(read_junit(data[:MAX_REPORT_BYTES], relative, MAX_REPORT_BYTES if truncated else None))
    return reads


def _xcresult_bundles(declared: StageTests, workspace: Path) -> list[ReportRead]:
    bundles = _matches(declared.xcresult, workspace, directories=True)
    if not bundles:
        return []
    xcrun = shutil.which("xcrun")
    reads = []
    for relative in bundles:
        if xcrun is None:
            reads.append(
                ReportRead(warnings=[f"{relative}: not read: xcrun is not on this agent (no Xcode)"])
            )
            continue
        reads.append(_xcresulttool(xcrun, workspace / relative, relative))
    return reads


def _xcresulttool(xcrun: str, bundle: Path, relative: str) -> ReportRead:
    """`xcrun xcresulttool get test-results tests --path BUNDLE` (Xcode 16+) read as JSON."""
    command = [xcrun, "xcresulttool", "get", "test-results", "tests", "--path", str(bundle)]
    try:
        done = subprocess.run(command, capture_output=True, timeout=XCRESULTTOOL_TIMEOUT_SEC, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ReportRead(warnings=[f"{relative}: xcresulttool did not answer ({type(exc).__name__})"])
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return ReportRead(
            warnings=[
                f"{relative}: xcresulttool exited {done.returncode}"
                + (f": {said[0][:300]}" if said else "")
                + " (Xcode 16 or later reads result bundles with `get test-results`)"
            ]
        )
    return read_xcresult_json(done.stdout[: MAX_REPORT_BYTES + 1], relative)


def _matches(patterns: tuple[str, ...], workspace: Path, directories: bool) -> list[str]:
    """Workspace-relative paths the globs match, in order, each once, none outside the workspace
    (a link that leads out is not followed), at most MAX_REPORTS."""
    root = workspace.resolve()
    found: dict[str, None] = {}
    for pattern in patterns:
        for match in sorted(glob.glob(pattern, root_dir=workspace, recursive=True)):
            path = workspace / match
            real = path.resolve()
            if not real.is_relative_to(root) or (path.is_dir() if directories else path.is_file()) is False:
                continue
            found.setdefault(os.path.normpath(match).replace(os.sep, "/"))
            if len(found) >= MAX_REPORTS:
                return list(found)
    return list(found)


def _earlier_tests(attempt: Attempt) -> list[TestResult]:
    """The latest earlier attempt's tests of this stage (or shard), from its document; none when
    no earlier attempt stored one (403 without s3:ListBucket, not 404, for a missing key)."""
    home = JobPrefix.of(attempt.artifact_uri)
    for earlier in range(attempt.attempt - 1, max(0, attempt.attempt - 1 - EARLIER_ATTEMPTS), -1):
        key = test_results_key(home, attempt.stage, attempt.shard, earlier)
        try:
            body = client("s3").get_object(Bucket=home.bucket, Key=key)["Body"].read()
            document = ResultsDocument.model_validate_json(body)
        except Exception:  # noqa: BLE001 - missing, unreadable or of another shape: look further back
            continue
        if document.schema_version == RESULTS_SCHEMA:
            return document.tests
    return []


def _store(bucket: str, key: str, data: bytes, sha: str) -> None:
    """Stored with its MD5 (S3 refuses bytes that do not match it: BadDigest, as the handoff's
    manifests are checked) and its sha256 in the metadata the summary repeats."""
    md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
    client("s3").put_object(
        Bucket=bucket,
        Key=key,
        Body=data,
        ContentMD5=md5,
        ContentType="application/json",
        Metadata={"sha256": sha},
    )


def _said(summary: dict[str, Any]) -> str:
    parts = [f"{summary['total']} tests", f"{summary['passed']} passed"]
    for name in ("failed", "error", "skipped", "flaky", "quarantined"):
        if summary.get(name):
            parts.append(f"{summary[name]} {name}")
    reports = summary["reports"]
    line = f"[relevo] tests: {', '.join(parts)} ({reports} report{'s' if reports != 1 else ''})"
    if summary.get("warnings"):
        line += f"; warning: {summary['warnings'][0]}"
    return line


def read_stage_reports(
    agent_id: str, run: StageRun, plan: StagePlan, workspace: Path, envelope: JobEnvelope, shipper: Any
) -> TestsRead | None:
    """The stage's declared test reports read and stored (relevo_agent.test_reports); None
    when it declares none or the run was stopped (nothing of it is reported then)."""
    if plan.tests is None or not plan.tests.declared or run.reason is not None:
        return None
    ref = run.ref
    attempt = Attempt(envelope.artifact_uri, ref.job_id, plan.name, ref.shard, ref.attempt, agent_id)
    try:
        return read_reports(plan.tests, workspace, attempt, shipper.line)
    except Exception:  # noqa: BLE001 - a reader's own fault never fails the stage
        log.exception("%s/%s: its test reports could not be read", ref.job_id, plan.name)
        shipper.line("[relevo] tests: the reports could not be read (see the agent's log)")
        said = ResultsSummary(warnings=["the test reports could not be read (see the agent's log)"])
        return TestsRead(said.model_dump(mode="json"), failed_only_in_quarantine=False)
