"""A job's tests as `GET /jobs/{id}/tests` answers them (docs/test-results.md, "Where results
show"): every stage's and shard's results documents (relevo_core.models.test_results) merged,
counted, filtered and paged.

Each stage (or shard) counts by its last attempt: the document its record's `tests` summary names,
read at the key derived from the job's prefix (never the stored location as written: an agent
wrote it, relevo_core.models.job_objects) and checked against the summary's sha256. A retry's
document already holds the runs of its stage's or shard's earlier attempts, theirs first (the
agent merges them: relevo_core.test_results.merge), so a test that failed and then passed in the
retry is flaky in it: counted once, and no earlier attempt's document is read.

A request reads each document once. A 20,000-test job's documents are some 6 MB of JSON: they are
parsed by pydantic-core's JSON reader in one pass, only the fields every test needs checked (id,
status, duration, runs), the page found by a partial sort, and only the page's and the slowest
tests validated whole (TestResult) and made into answer rows."""

from __future__ import annotations

import base64
import binascii
import gc
import hashlib
import heapq
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic_core import from_json

from relevo_core.jobs.handoff_sources import context_of
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.job_objects import JobPrefix, expected_key, test_results_key
from relevo_core.models.requests import JobTestsQuery
from relevo_core.models.test_results import (
    FAILING,
    RESULTS_SCHEMA,
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


_STATUSES = frozenset({"passed", "failed", "error", "skipped"})


@dataclass(frozen=True)
class _Test:
    """The fields of a test every request needs (to count, filter, order), read straight from the
    document's JSON: the whole TestResult is validated only for the tests an answer shows."""

    id: str
    status: str
    duration_sec: float
    runs: tuple[str, ...]
    flaky: bool
    quarantined: bool
    raw: dict[str, Any]

    @classmethod
    def read(cls, raw: Any) -> _Test | None:
        if not isinstance(raw, dict):
            return None
        test_id, status, duration = raw.get("id"), raw.get("status"), raw.get("duration_sec", 0.0)
        runs = raw.get("runs") or []
        if (
            not isinstance(test_id, str)
            or status not in _STATUSES
            or not isinstance(duration, int | float)
            or isinstance(duration, bool)
            or duration < 0
            or not isinstance(runs, list)
            or any(run not in _STATUSES for run in runs)
        ):
            return None
        return cls(
            test_id,
            status,
            float(duration),
            tuple(runs),
            raw.get("flaky") is True,
            raw.get("quarantined") is True,
            raw,
        )


@dataclass(frozen=True)
class _Row:
    """A test of the merged listing with the place it ran."""

    source: _Source
    test: _Test
    status: str  # the listing's: failed, error, flaky, skipped, passed
    runs: tuple[str, ...]

    def sort_key(self) -> tuple[int, int, int, str]:
        shard = -1 if self.source.shard is None else self.source.shard
        return (_RANK[self.status], self.source.stage_index, shard, self.test.id)

    def view(self) -> dict[str, Any]:
        try:
            test = TestResult.model_validate(self.test.raw)
            suite, name, message, file, line = test.suite, test.name, test.message, test.file, test.line
        except ValidationError:  # counted and listed by its id; its other fields are not shown
            suite, name, message, file, line = "", self.test.id, None, None, None
        return {
            "id": self.test.id,
            "suite": suite,
            "name": name,
            "status": self.status,
            "stage": self.source.stage,
            "shard": self.source.shard,
            "attempt": self.source.attempt,
            "agent_id": self.source.agent_id,
            "duration_sec": self.test.duration_sec,
            "message": message,
            "file": file,
            "line": line,
            "runs": list(self.runs),
            "flaky": self.status == "flaky",
            "quarantined": self.test.quarantined,
        }


def _matches(row: _Row, wanted: str | None) -> bool:
    if wanted is None:
        return True
    if wanted == "failed":
        return row.status in FAILING
    return row.status == wanted


def _tests_of(data: bytes, where: str, source: _Source) -> list[_Test] | None:
    """A document's tests (None when it is not a results document this reader knows): parsed by
    pydantic-core's JSON reader, each test's needed fields checked, a test without them said."""
    try:
        document = from_json(data)
    except ValueError:
        source.warnings.append(f"{where} is not JSON: not read")
        return None
    if not isinstance(document, dict) or not isinstance(document.get("tests"), list):
        source.warnings.append(f"{where} is not a results document: not read")
        return None
    version = document.get("schema_version")
    if not isinstance(version, int) or version > RESULTS_SCHEMA:
        source.warnings.append(f"{where} has schema {version!r}, not one this reader knows: not read")
        return None
    tests = [_Test.read(raw) for raw in document["tests"]]
    unreadable = sum(test is None for test in tests)
    if unreadable:
        source.warnings.append(
            f"{where}: {unreadable} tests without an id, a status or a duration: not listed"
        )
    return [test for test in tests if test is not None]


def _document(
    read: ReadDocument, home: JobPrefix, key: str, sha256: str | None, source: _Source
) -> list[_Test] | None:
    data = read(home.bucket, key)
    if data is None:
        source.warnings.append(f"{home.uri(key)} is gone")
        return None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        source.warnings.append(f"{home.uri(key)} is not the document its record names (sha256): not read")
        return None
    return _tests_of(data, home.uri(key), source)


def _listed(test: _Test) -> tuple[_Test, str, tuple[str, ...]]:
    """A test with its listing status and runs: flaky when it passed in the end after a failing
    run (its document's `flaky`, or its runs say so), counted once."""
    runs = test.runs or (test.status,)
    flaky = test.status == "passed" and (test.flaky or any(run in FAILING for run in runs))
    return test, "flaky" if flaky else test.status, runs


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


@contextmanager
def _no_collection() -> Iterator[None]:
    """The cyclic collector paused: a 20,000-test job's dicts and rows hold no cycles, and its
    passes while they are made find nothing and cost a third of the request (bench/results_page)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def job_tests(items: list[dict[str, Any]], read: ReadDocument, query: JobTestsQuery) -> dict[str, Any]:
    """The job's tests from its records (`items`, store.jobs.query_job_items) and its results
    documents (`read`): counts of them all, `tests` one page of them (filtered by status, the
    failures first, then by stage, shard and id), `next_page_token`, the `slowest`, and `sources`
    (each stage and shard read, with what was said of it)."""
    with _no_collection():
        return _job_tests(items, read, query)


def _job_tests(items: list[dict[str, Any]], read: ReadDocument, query: JobTestsQuery) -> dict[str, Any]:
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
        source.read, source.tests = True, len(last)
        digests.append(f"{key}:{summary.sha256}")
        rows.extend(_Row(source, *_listed(test)) for test in last)
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


def show_job_tests(table: str, job_id: str, query: JobTestsQuery) -> dict[str, Any]:
    """GET /jobs/{id}/tests: the job's records read, then its documents (job_tests)."""
    from relevo_core.store.jobs import query_job_items
    from relevo_core.store.results_documents import read_document

    return job_tests(query_job_items(table, job_id), read_document, query)


def job_failures(table: str, job_id: str, limit: int) -> list[dict[str, Any]]:
    """The job's failed tests (failed or error), at most `limit`, as GET /jobs/{id}/tests lists
    them: what its check run annotates and its commit status names (relevo_core.notify). One
    listing, each document read once, however many there are (no page bound: not a request's)."""
    from relevo_core.store.jobs import query_job_items
    from relevo_core.store.results_documents import read_document

    query = JobTestsQuery.model_construct(status="failed", limit=limit, page_token=None, slowest=0)
    return list(job_tests(query_job_items(table, job_id), read_document, query)["tests"])
