"""A job's tests as `GET /jobs/{id}/tests` answers them (docs/test-results.md, "Where results
show"): every stage's and shard's results documents (relevo_core.models.test_results) merged,
counted, filtered and paged.

Each stage (or shard) counts by its last attempt: the document its record's `tests` summary names,
read at the key derived from the job's prefix (never the stored location as written: an agent
wrote it, relevo_core.models.job_objects) and checked against the summary's sha256. The earlier
attempts' documents of a retried shard are read too, so that a test's runs read across attempts
(the retry's last) and a test that failed and then passed in the retry is flaky, counted once.

A request reads each document once. A 20,000-test job's documents are some 8 MB of JSON: they are
parsed by pydantic-core in one pass, sorted by a key tuple, and only the page's and the slowest
tests are made into answer rows."""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from relevo_core.jobs.handoff_sources import context_of
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.job_objects import JobPrefix, expected_key, test_results_key
from relevo_core.models.requests import JobTestsQuery
from relevo_core.models.test_results import (
    FAILING,
    RESULTS_SCHEMA,
    ResultsDocument,
    ResultsSummary,
    TestResult,
)
from relevo_core.store.keys import JOB_SK, is_stage_sk, shard_of_sk

log = logging.getLogger("relevo_core.jobs.results_listing")

# A document's bytes by key, or None when it is not there (relevo_core.store.results_documents).
ReadDocument = Callable[[str, str], bytes | None]

# The order a listing shows: what needs looking at first.
_RANK = {"failed": 0, "error": 0, "flaky": 1, "skipped": 2, "passed": 3}


@dataclass
class _Source:
    """One stage's or shard's tests: where they came from, as the answer's `sources` says."""

    stage: str
    stage_index: int
    shard: int | None
    attempt: int | None
    agent_id: str | None
    results_key: str | None
    tests: int = 0
    read: bool = False
    warnings: list[str] = field(default_factory=list)
    cut: bool = False

    def view(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "shard": self.shard,
            "attempt": self.attempt,
            "agent_id": self.agent_id,
            "results_key": self.results_key,
            "tests": self.tests,
            "read": self.read,
            "warnings": self.warnings,
            "cut": self.cut,
        }


@dataclass(frozen=True)
class _Row:
    """A test of the merged listing (a TestResult with the place it ran)."""

    source: _Source
    test: TestResult
    status: str  # the listing's: failed, error, flaky, skipped, passed
    runs: tuple[str, ...]

    def sort_key(self) -> tuple[int, int, int, str]:
        shard = -1 if self.source.shard is None else self.source.shard
        return (_RANK[self.status], self.source.stage_index, shard, self.test.id)

    def view(self) -> dict[str, Any]:
        test = self.test
        return {
            "id": test.id,
            "suite": test.suite,
            "name": test.name,
            "status": self.status,
            "stage": self.source.stage,
            "shard": self.source.shard,
            "attempt": self.source.attempt,
            "agent_id": self.source.agent_id,
            "duration_sec": test.duration_sec,
            "message": test.message,
            "file": test.file,
            "line": test.line,
            "runs": list(self.runs),
            "flaky": self.status == "flaky",
            "quarantined": test.quarantined,
        }


def _matches(row: _Row, wanted: str | None) -> bool:
    if wanted is None:
        return True
    if wanted == "failed":
        return row.status in FAILING
    return row.status == wanted


def _document(
    read: ReadDocument, home: JobPrefix, key: str, sha256: str | None, source: _Source
) -> ResultsDocument | None:
    data = read(home.bucket, key)
    if data is None:
        source.warnings.append(f"{home.uri(key)} is gone")
        return None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        source.warnings.append(f"{home.uri(key)} is not the document its record names (sha256): not read")
        return None
    try:
        document = ResultsDocument.model_validate_json(data)
    except ValidationError as exc:
        source.warnings.append(f"{home.uri(key)} is not a results document ({exc.error_count()} problems)")
        return None
    if document.schema_version > RESULTS_SCHEMA:
        source.warnings.append(
            f"{home.uri(key)} has schema {document.schema_version}, newer than this reader's"
        )
        return None
    return document


def _merged(
    last: ResultsDocument, earlier: list[ResultsDocument]
) -> list[tuple[TestResult, str, tuple[str, ...]]]:
    """Each test of the last attempt with its runs across the attempts (earlier attempts' first)
    and its listing status: flaky when it passed in the end after a failing run, counted once. A
    document whose runs already hold the earlier attempts' (its writer merged them) is kept as is."""
    before: dict[str, list[str]] = {}
    for document in earlier:
        for test in document.tests:
            before.setdefault(test.id, []).extend(test.runs or [test.status])
    merged = []
    for test in last.tests:
        runs = list(test.runs or [test.status])
        prior = before.get(test.id, [])
        if prior and runs[: len(prior)] != prior:
            runs = prior + runs
        flaky = test.status == "passed" and (test.flaky or any(run in FAILING for run in runs))
        merged.append((test, "flaky" if flaky else test.status, tuple(runs)))
    return merged


def _page_token(offset: int, status: str | None, fingerprint: str) -> str:
    text = json.dumps({"o": offset, "s": status, "f": fingerprint}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _offset_of(token: str | None, status: str | None, fingerprint: str) -> int:
    if token is None:
        return 0
    try:
        given = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        offset, filtered, made_for = int(given["o"]), given["s"], str(given["f"])
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise RelevoError(ErrorCode.QUERY_INVALID, "page_token is not a page token of this listing") from exc
    if filtered != status or offset < 0:
        raise RelevoError(
            ErrorCode.QUERY_INVALID, "page_token is of another listing (another status filter): start again"
        )
    if made_for != fingerprint:
        raise RelevoError(
            ErrorCode.QUERY_INVALID,
            "the job's results changed since this page token was given (an attempt ended): start again",
        )
    return offset


def job_tests(items: list[dict[str, Any]], read: ReadDocument, query: JobTestsQuery) -> dict[str, Any]:
    """The job's tests from its records (`items`, store.jobs.query_job_items) and its results
    documents (`read`): counts of them all, `tests` one page of them (filtered by status, the
    failures first, then by stage, shard and id), `next_page_token`, the `slowest`, and `sources`
    (each stage and shard read, with what was said of it)."""
    record = next((item for item in items if item["sk"] == JOB_SK), None)
    if record is None:
        raise RelevoError(ErrorCode.JOB_NOT_FOUND, "no such job")
    envelope = context_of(items).envelope
    home = JobPrefix.of(envelope.artifact_uri)
    sources: list[_Source] = []
    rows: list[_Row] = []
    digests: list[str] = []
    for item in items:
        sk = str(item["sk"])
        place = shard_of_sk(sk)
        if place is None and not is_stage_sk(sk):
            continue
        summary_given = item.get("tests")
        if not isinstance(summary_given, dict):
            continue
        stage_index = place[0] if place else int(sk.split("#")[1])
        stage = envelope.stages[stage_index].name
        shard = place[1] if place else None
        attempt = item.get("attempt")
        source = _Source(stage, stage_index, shard, attempt, item.get("agent_id"), None)
        sources.append(source)
        try:
            summary = ResultsSummary.model_validate(summary_given)
        except ValidationError:
            source.warnings.append("its record's tests summary is not one: not read")
            continue
        source.cut = summary.cut
        source.warnings.extend(summary.warnings)
        if not isinstance(attempt, int) or summary.results_key is None:
            continue
        try:
            key = expected_key(
                home,
                home.uri(summary.results_key),
                test_results_key(home, stage, shard, attempt),
                (item["pk"], sk),
            )
        except RelevoError as refused:
            source.warnings.append(refused.message)
            continue
        source.results_key = key
        last = _document(read, home, key, summary.sha256, source)
        if last is None:
            continue
        earlier = []
        for failed in sorted({entry.get("attempt") for entry in item.get("attempts_log") or []} - {None}):
            if isinstance(failed, int) and failed < attempt:
                data = read(home.bucket, test_results_key(home, stage, shard, failed))
                if data is not None:
                    try:
                        earlier.append(ResultsDocument.model_validate_json(data))
                    except ValidationError:
                        source.warnings.append(
                            f"attempt {failed}'s results document is not one: its runs not merged"
                        )
        source.read, source.tests = True, len(last.tests)
        digests.append(f"{key}:{summary.sha256}")
        rows.extend(_Row(source, test, status, runs) for test, status, runs in _merged(last, earlier))
    counts = {"total": len(rows), "passed": 0, "failed": 0, "error": 0, "skipped": 0, "flaky": 0}
    quarantined, duration = 0, 0.0
    for row in rows:
        counts["passed" if row.status == "flaky" else row.status] += 1
        counts["flaky"] += row.status == "flaky"
        quarantined += row.test.quarantined
        duration += row.test.duration_sec
    fingerprint = hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()[:16]
    offset = _offset_of(query.page_token, query.status, fingerprint)
    chosen = [row for row in rows if _matches(row, query.status)]
    # Only the rows up to the end of the page are ordered (a partial sort), never all 20,000.
    page = heapq.nsmallest(offset + query.limit, chosen, key=_Row.sort_key)[offset:]
    after = offset + len(page)
    slowest = heapq.nlargest(query.slowest, rows, key=lambda row: (row.test.duration_sec, row.test.id))
    return {
        "job_id": envelope.job_id,
        "job_status": record["status"],
        "counts": {**counts, "quarantined": quarantined, "duration_sec": round(duration, 3)},
        "status": query.status,
        "matching": len(chosen),
        "tests": [row.view() for row in page],
        "next_page_token": _page_token(after, query.status, fingerprint) if after < len(chosen) else None,
        "slowest": [row.view() for row in slowest],
        "sources": [
            source.view() for source in sorted(sources, key=lambda s: (s.stage_index, s.shard or -1))
        ],
    }
