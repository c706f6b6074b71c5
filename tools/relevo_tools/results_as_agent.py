"""A stage's (or shard's) tests stored as relevo-agent stores them after its command (docs/
test-results.md): the ResultsDocument JSON at test_results_key under the job's prefix, and its
ResultsSummary (results_key and sha256 included) as the stage's or shard's record's `tests`.

Used where a test or a bench needs a job's results without running an agent over real reports: the records
it returns are the ones an agent run would leave, so a test can later swap this for a real run."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from relevo_core.models.job_objects import JobPrefix, test_results_key
from relevo_core.models.test_results import FAILING, ResultsDocument, ResultsSummary, TestResult

# (bucket, key, body): where a document is put (an S3 put_object, or a dict in unit tests).
PutObject = Callable[[str, str, bytes], None]


def result_of(suite: str, name: str, status: str = "passed", **fields: Any) -> TestResult:
    return TestResult(id=f"{suite}::{name}", suite=suite, name=name, status=status, **fields)


def summary_of(tests: Iterable[TestResult]) -> ResultsSummary:
    tests = list(tests)
    count = {
        status: sum(test.status == status for test in tests)
        for status in ("passed", "failed", "error", "skipped")
    }
    return ResultsSummary(
        total=len(tests),
        **count,
        flaky=sum(test.flaky for test in tests),
        quarantined=sum(test.quarantined for test in tests),
        duration_sec=round(sum(test.duration_sec for test in tests), 3),
        reports=1,
    )


def store_results_as_agent(
    put: PutObject,
    home: JobPrefix,
    job_id: str,
    stage: str,
    shard: int | None,
    attempt: int,
    agent_id: str,
    tests: Iterable[TestResult],
) -> dict[str, Any]:
    """Store the attempt's results document; returns the summary for its record's `tests`."""
    tests = list(tests)
    key = test_results_key(home, stage, shard, attempt)
    counted = summary_of(tests)
    document = ResultsDocument(
        job_id=job_id,
        stage=stage,
        shard=shard,
        attempt=attempt,
        agent_id=agent_id,
        summary=counted,
        tests=tests,
    )
    body = document.model_dump_json().encode()
    put(home.bucket, key, body)
    return counted.model_copy(
        update={"results_key": key, "sha256": hashlib.sha256(body).hexdigest()}
    ).model_dump(mode="json")


def failing(tests: Iterable[TestResult]) -> list[TestResult]:
    return [test for test in tests if test.status in FAILING]
