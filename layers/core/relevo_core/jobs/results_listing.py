"""A job's tests as `GET /jobs/{id}/tests` answers them (docs/test-results.md, "Where results
show"): every stage's and shard's results documents (relevo_core.models.test_results) merged,
counted, filtered and paged.

Each stage (or shard) counts by its last attempt: the document its record's `tests` summary names,
read at the key derived from the job's prefix (never the stored location as written: an agent
wrote it, relevo_core.models.job_objects) and checked against the summary's sha256. A retry's
document already holds the runs of its stage's or shard's earlier attempts, theirs first (the
agent merges them: relevo_core.test_results.merge), so a test that failed and then passed in the
retry is flaky in it: counted once, and no earlier attempt's document is read.

A request reads each document once. A 20,000-test job's documents are some 6 MB of JSON: each is
parsed and its tests' needed fields (id, status, duration, runs) checked in one pass by
pydantic-core (_ListedDocument), kept as columns (_Read), the page found by sorting only the
stage's or shard's tests it reaches into, and only the page's and the slowest tests validated whole
(TestResult) and made into answer rows (bench/results_page.py: about 2x the floor of parsing the
documents, where the per-test Python reading was 3.5-4x)."""

from __future__ import annotations

import base64
import binascii
import bisect
import gc
import hashlib
import heapq
import itertools
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from typing import Annotated, Any, Literal, NotRequired, cast

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import from_json
from typing_extensions import TypedDict

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
_Status = Literal["passed", "failed", "error", "skipped"]


class _ListedTest(TypedDict):
    """The fields of a test every request needs (to count, filter, order), checked in pydantic-core
    as the document is parsed; the rest carried as read. The whole TestResult is validated only for
    the tests an answer shows. Strict: what it takes, _readable takes too (a document it refuses is
    read test by test, each unreadable test said)."""

    __pydantic_config__ = ConfigDict(extra="allow", strict=True)  # type: ignore[misc]  # pydantic reads it
    id: str
    status: _Status
    duration_sec: NotRequired[Annotated[float, Field(ge=0)]]
    runs: NotRequired[list[_Status] | None]


class _ListedDocument(TypedDict):
    __pydantic_config__ = ConfigDict(extra="ignore", strict=True)  # type: ignore[misc]  # pydantic reads it
    schema_version: Annotated[int, Field(le=RESULTS_SCHEMA)]
    tests: list[_ListedTest]


_LISTED_DOCUMENT = TypeAdapter(_ListedDocument)


def _readable(raw: Any) -> bool:
    """A test with an id, a status and a duration (any other field is shown only if it validates)."""
    if not isinstance(raw, dict):
        return False
    test_id, status, duration = raw.get("id"), raw.get("status"), raw.get("duration_sec", 0.0)
    runs = raw.get("runs") or []
    return (
        isinstance(test_id, str)
        and status in _STATUSES
        and isinstance(duration, int | float)
        and not isinstance(duration, bool)
        and duration >= 0
        and isinstance(runs, list)
        and all(run in _STATUSES for run in runs)
    )


class _Read:
    """One stage's or shard's tests as columns: the listing needs every test's id, status and
    duration, and makes a row (_Row) only of the tests it shows."""

    def __init__(self, source: _Source, tests: list[dict[str, Any]]) -> None:
        self.source = source
        self.tests = tests
        self.ids = [test["id"] for test in tests]
        # The listing's status: flaky when it passed in the end after a failing run (its document's
        # `flaky`, or its runs say so), counted once. Inline: it is the one pass over every test.
        self.statuses = [
            "flaky"
            if test["status"] == "passed"
            and (test.get("flaky") is True or not FAILING.isdisjoint(test.get("runs") or ()))
            else test["status"]
            for test in tests
        ]
        self.durations = [float(test.get("duration_sec", 0.0)) for test in tests]
        self.counts = Counter(self.statuses)
        shard = -1 if source.shard is None else source.shard
        self.order = (source.stage_index, shard)

    def rows_of(self, statuses: frozenset[str]) -> list[_Row]:
        """Its tests of these statuses, by id (a stable sort: equal ids as the document had them)."""
        chosen = [index for index, status in enumerate(self.statuses) if status in statuses]
        chosen.sort(key=self.ids.__getitem__)
        return [self.row(index) for index in chosen]

    def row(self, index: int) -> _Row:
        test, status = self.tests[index], self.statuses[index]
        runs = tuple(test.get("runs") or (test["status"],))  # no runs listed: its one run
        return _Row(self.source, test, status, self.durations[index], runs)


@dataclass(frozen=True)
class _Row:
    """A test of the listing that an answer shows, with the place it ran."""

    source: _Source
    test: dict[str, Any]
    status: str  # the listing's: failed, error, flaky, skipped, passed
    duration_sec: float
    runs: tuple[str, ...]

    def view(self) -> dict[str, Any]:
        try:
            test = TestResult.model_validate(self.test)
            suite, name, message, file, line = test.suite, test.name, test.message, test.file, test.line
        except ValidationError:  # counted and listed by its id; its other fields are not shown
            suite, name, message, file, line = "", self.test["id"], None, None, None
        return {
            "id": self.test["id"],
            "suite": suite,
            "name": name,
            "status": self.status,
            "stage": self.source.stage,
            "shard": self.source.shard,
            "attempt": self.source.attempt,
            "agent_id": self.source.agent_id,
            "duration_sec": self.duration_sec,
            "message": message,
            "file": file,
            "line": line,
            "runs": list(self.runs),
            "flaky": self.status == "flaky",
            "quarantined": self.test.get("quarantined") is True,
        }


def _wanted(status: str | None) -> frozenset[str]:
    if status is None:
        return frozenset(_RANK)
    return FAILING if status == "failed" else frozenset({status})


def _tests_of(data: bytes, where: str, source: _Source) -> list[dict[str, Any]] | None:
    """A document's tests (None when it is not a results document this reader knows). Parsed and
    checked in one pass by pydantic-core (_ListedDocument); a document it refuses is read again
    test by test, so that what is wrong is said and the readable tests still listed."""
    try:
        # Its tests as plain dicts (a TypedDict is one), not copied.
        return cast(list[dict[str, Any]], _LISTED_DOCUMENT.validate_json(data)["tests"])
    except ValidationError:
        pass
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
    tests = [raw for raw in document["tests"] if _readable(raw)]
    unreadable = len(document["tests"]) - len(tests)
    if unreadable:
        source.warnings.append(
            f"{where}: {unreadable} tests without an id, a status or a duration: not listed"
        )
    return tests


def _document(
    read: ReadDocument, home: JobPrefix, key: str, sha256: str | None, source: _Source
) -> list[dict[str, Any]] | None:
    data = read(home.bucket, key)
    if data is None:
        source.warnings.append(f"{home.uri(key)} is gone")
        return None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        source.warnings.append(f"{home.uri(key)} is not the document its record names (sha256): not read")
        return None
    return _tests_of(data, home.uri(key), source)


def _page(reads: list[_Read], wanted: frozenset[str], offset: int, limit: int) -> list[_Row]:
    """The rows from `offset`, at most `limit`, of the listing's order: the failures first, then by
    stage, shard and id. A stage's or shard's tests of one rank are sorted only when the page
    reaches into them; the ones before the page are skipped by their count."""
    ordered = sorted(reads, key=lambda read: read.order)  # stable: records in the order read
    page: list[_Row] = []
    for rank in sorted(set(_RANK.values())):
        statuses = frozenset(status for status in wanted if _RANK[status] == rank)
        for read in ordered:
            size = sum(read.counts[status] for status in statuses)
            if offset >= size:
                offset -= size
                continue
            page.extend(read.rows_of(statuses)[offset : offset + limit - len(page)])
            offset = 0
            if len(page) >= limit:
                return page
    return page


def _slowest(reads: list[_Read], count: int) -> list[_Row]:
    """The `count` slowest tests, by duration then id (equal ones in the order read): plain tuples
    compared in C, the place of each found again from its position in the order read."""
    if count == 0:
        return []
    ranked = zip(
        chain.from_iterable(read.durations for read in reads),
        chain.from_iterable(read.ids for read in reads),
        itertools.count(0, -1),  # the earlier of equal tests first
    )
    starts = list(itertools.accumulate((len(read.ids) for read in reads), initial=0))
    rows = []
    for *_, back in heapq.nlargest(count, ranked):
        number = bisect.bisect_right(starts, -back) - 1
        rows.append(reads[number].row(-back - starts[number]))
    return rows


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
    reads: list[_Read] = []
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
        reads.append(_Read(source, last))
    counts = {"total": 0, "passed": 0, "failed": 0, "error": 0, "skipped": 0, "flaky": 0}
    quarantined, duration = 0, 0.0
    for each in reads:
        counts["total"] += len(each.ids)
        for status, many in each.counts.items():
            counts["passed" if status == "flaky" else status] += many
        counts["flaky"] += each.counts["flaky"]
        quarantined += sum(test.get("quarantined") is True for test in each.tests)
        duration = sum(each.durations, duration)
    fingerprint = hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()[:16]
    offset = _offset_of(query.page_token, query.status, fingerprint)
    wanted = _wanted(query.status)
    matching = sum(each.counts[status] for each in reads for status in wanted)
    page = _page(reads, wanted, offset, query.limit)
    after = offset + len(page)
    return {
        "job_id": envelope.job_id,
        "job_status": record["status"],
        "counts": {**counts, "quarantined": quarantined, "duration_sec": round(duration, 3)},
        "status": query.status,
        "matching": matching,
        "tests": [row.view() for row in page],
        "next_page_token": _page_token(after, query.status, fingerprint) if after < matching else None,
        "slowest": [row.view() for row in _slowest(reads, query.slowest)],
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
