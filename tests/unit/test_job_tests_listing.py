"""GET /jobs/{id}/tests (relevo_core.jobs.results_listing): a job's tests merged across its stages
and shards (each shard's last attempt, a test's runs across attempts, flaky counted once), counted,
filtered by status, paged by token, the slowest listed; each with its stage, shard and Mac. The
documents are stored as the agent stores them (relevo_tools.results_as_agent)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from relevo_core.jobs.results_listing import job_tests
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.job_objects import JobPrefix
from relevo_core.models.requests import JobTestsQuery, parse_query
from relevo_core.store.keys import JOB_SK, shard_sk, stage_sk
from relevo_tools.results_as_agent import result_of, store_results_as_agent
from tests.unit.test_envelope import minimal_envelope

STAGES = [{"name": "build", "command": "make"}, {"name": "test", "command": "make test", "parallel": 2}]
ENVELOPE = minimal_envelope(stages=STAGES)
HOME = JobPrefix.of(ENVELOPE["artifact_uri"])
JOB = ENVELOPE["job_id"]


class Bucket:
    """The artifact bucket as a dict, counting each read."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}
        self.reads: list[str] = []

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.objects[(bucket, key)] = body

    def read(self, bucket: str, key: str) -> bytes | None:
        self.reads.append(key)
        return self.objects.get((bucket, key))


def _job(bucket: Bucket) -> list[dict[str, Any]]:
    """build: 2 tests on mac-1; test shard 0 on mac-2 (a failure with file and line, a skip);
    test shard 1 retried: attempt 1 on mac-3 failed `t.Net::retry_me`, attempt 2 on mac-4 passed it
    (its document holds both runs, the earlier attempt's first, as the agent merges them)."""
    build = store_results_as_agent(
        bucket.put,
        HOME,
        JOB,
        "build",
        None,
        1,
        "mac-1",
        [result_of("b.Compile", "one", duration_sec=0.5), result_of("b.Compile", "two", duration_sec=3.0)],
    )
    shard0 = store_results_as_agent(
        bucket.put,
        HOME,
        JOB,
        "test",
        0,
        1,
        "mac-2",
        [
            result_of(
                "t.Math",
                "adds",
                "failed",
                file="tests/t_math.py",
                line=12,
                message="assert 2 == 3",
                duration_sec=0.2,
            ),
            result_of("t.Math", "skips", "skipped", message="needs a GPU"),
            result_of("t.Math", "slow[a/b::c]", duration_sec=9.0),
        ],
    )
    store_results_as_agent(
        bucket.put,
        HOME,
        JOB,
        "test",
        1,
        1,
        "mac-3",
        [result_of("t.Net", "retry_me", "failed", message="timeout"), result_of("t.Net", "steady")],
    )
    shard1 = store_results_as_agent(
        bucket.put,
        HOME,
        JOB,
        "test",
        1,
        2,
        "mac-4",
        [
            result_of("t.Net", "retry_me", duration_sec=1.0, runs=["failed", "passed"], flaky=True),
            result_of("t.Net", "steady"),
        ],
    )
    return [
        {"pk": f"JOB#{JOB}", "sk": JOB_SK, "status": "failed", "envelope": ENVELOPE},
        {
            "pk": f"STAGES#{JOB}",
            "sk": stage_sk(0),
            "stage_name": "build",
            "status": "succeeded",
            "attempt": 1,
            "agent_id": "mac-1",
            "tests": build,
        },
        {"pk": f"STAGES#{JOB}", "sk": stage_sk(1), "stage_name": "test", "status": "failed"},
        {
            "pk": f"STAGES#{JOB}",
            "sk": shard_sk(1, 0),
            "stage_name": "test",
            "shard_index": 0,
            "status": "failed",
            "attempt": 1,
            "agent_id": "mac-2",
            "tests": shard0,
        },
        {
            "pk": f"STAGES#{JOB}",
            "sk": shard_sk(1, 1),
            "stage_name": "test",
            "shard_index": 1,
            "status": "succeeded",
            "attempt": 2,
            "agent_id": "mac-4",
            "tests": shard1,
            "attempts_log": [{"attempt": 1, "agent": "mac-3", "error": "Relevo.Transient.ExitCode"}],
        },
    ]


def _query(**given: str) -> JobTestsQuery:
    return parse_query(JobTestsQuery, given)


def test_the_jobs_tests_are_merged_across_stages_and_shards_with_where_each_ran():
    # Given a job whose build stage and two shards stored their results, shard 1 retried
    bucket = Bucket()
    items = _job(bucket)

    # When its tests are listed
    answer = job_tests(items, bucket.read, _query())

    # Then every test of each stage's and shard's last attempt is counted once: the retried
    # shard's `retry_me` failed on attempt 1 and passed on attempt 2, so it is flaky, once
    assert answer["counts"] == {
        "total": 7,
        "passed": 5,
        "failed": 1,
        "error": 0,
        "skipped": 1,
        "flaky": 1,
        "quarantined": 0,
        "duration_sec": 13.7,
    }
    rows = {row["id"]: row for row in answer["tests"]}
    assert list(rows)[:3] == [
        "t.Math::adds",
        "t.Net::retry_me",
        "t.Math::skips",
    ]  # failures, flaky, skips first
    assert (
        rows["t.Math::adds"]["stage"],
        rows["t.Math::adds"]["shard"],
        rows["t.Math::adds"]["agent_id"],
    ) == (
        "test",
        0,
        "mac-2",
    )
    assert (rows["t.Math::adds"]["file"], rows["t.Math::adds"]["line"], rows["t.Math::adds"]["message"]) == (
        "tests/t_math.py",
        12,
        "assert 2 == 3",
    )
    retried = rows["t.Net::retry_me"]
    assert (retried["status"], retried["runs"], retried["agent_id"]) == (
        "flaky",
        ["failed", "passed"],
        "mac-4",
    )
    assert rows["b.Compile::one"]["shard"] is None and rows["b.Compile::one"]["agent_id"] == "mac-1"
    # An id with slashes and `::` in its parameters survives as written
    assert "t.Math::slow[a/b::c]" in rows
    assert [row["id"] for row in answer["slowest"][:2]] == ["t.Math::slow[a/b::c]", "b.Compile::two"]
    # And each stage's and shard's last document was read once (the retry's holds the earlier runs)
    assert sorted(bucket.reads) == sorted(set(bucket.reads)) and len(bucket.reads) == 3
    assert not any(key.endswith("test.shard-1.1.json") for key in bucket.reads)


@pytest.mark.parametrize(
    ("status", "ids"),
    [
        ("failed", ["t.Math::adds"]),
        ("flaky", ["t.Net::retry_me"]),
        ("skipped", ["t.Math::skips"]),
        ("passed", ["b.Compile::one", "b.Compile::two", "t.Math::slow[a/b::c]", "t.Net::steady"]),
    ],
)
def test_a_status_filter_lists_only_those_tests(status: str, ids: list[str]):
    # Given the job; when its tests are listed with a status filter
    bucket = Bucket()
    answer = job_tests(_job(bucket), bucket.read, _query(status=status))

    # Then only those are listed, the counts still of them all
    assert [row["id"] for row in answer["tests"]] == ids
    assert answer["matching"] == len(ids) and answer["counts"]["total"] == 7


def test_pages_follow_their_token_to_the_end_and_a_token_of_another_filter_is_refused():
    # Given the job, listed 3 tests a page
    bucket = Bucket()
    items = _job(bucket)
    seen, token = [], None
    # When every page is read by its token
    for _ in range(5):
        answer = job_tests(items, bucket.read, _query(limit="3", **({"page_token": token} if token else {})))
        seen += [row["id"] for row in answer["tests"]]
        token = answer["next_page_token"]
        if token is None:
            break
    # Then each test came once, and the last page says there is no next
    assert len(seen) == 7 == len(set(seen)) and token is None

    # And a token given for one filter is refused for another, and a made-up one too
    first = job_tests(items, bucket.read, _query(limit="1"))["next_page_token"]
    with pytest.raises(RelevoError) as other:
        job_tests(items, bucket.read, _query(limit="1", status="failed", page_token=first))
    assert other.value.code is ErrorCode.QUERY_INVALID and "another listing" in other.value.message
    with pytest.raises(RelevoError) as made_up:
        job_tests(items, bucket.read, _query(page_token="bm90LWpzb24"))
    assert made_up.value.code is ErrorCode.QUERY_INVALID


def test_a_page_token_is_refused_once_the_results_changed():
    # Given a token of the first page
    bucket = Bucket()
    items = _job(bucket)
    token = job_tests(items, bucket.read, _query(limit="2"))["next_page_token"]
    # When shard 0's retry ends with other results
    items[3]["attempt"], items[3]["tests"] = (
        2,
        store_results_as_agent(bucket.put, HOME, JOB, "test", 0, 2, "mac-5", [result_of("t.Math", "adds")]),
    )
    # Then the old token is refused: its offsets meant another listing
    with pytest.raises(RelevoError) as changed:
        job_tests(items, bucket.read, _query(limit="2", page_token=token))
    assert changed.value.code is ErrorCode.QUERY_INVALID and "changed" in changed.value.message


def test_a_page_is_bounded_and_bad_filters_are_refused():
    for given in (
        {"limit": "501"},
        {"limit": "0"},
        {"status": "error"},
        {"slowest": "51"},
        {"page_token": "a b"},
        {"sort": "id"},
    ):
        with pytest.raises(RelevoError) as refused:
            _query(**given)
        assert refused.value.code is ErrorCode.QUERY_INVALID, given


def test_a_document_outside_its_record_or_not_matching_its_sha256_is_not_read_and_is_said():
    # Given a record whose summary names another job's object, and one whose document was replaced
    bucket = Bucket()
    items = _job(bucket)
    items[1]["tests"] = {**items[1]["tests"], "results_key": "demo/other-job/.relevo-tests/build.1.json"}
    key = items[3]["tests"]["results_key"]
    bucket.objects[(HOME.bucket, key)] = json.dumps({"tampered": True}).encode()

    # When the tests are listed
    answer = job_tests(items, bucket.read, _query())

    # Then neither is read, the foreign key is never fetched, and each source says why
    assert "demo/other-job/.relevo-tests/build.1.json" not in bucket.reads
    sources = {(s["stage"], s["shard"]): s for s in answer["sources"]}
    assert (
        not sources[("build", None)]["read"]
        and "not under the job's prefix" in sources[("build", None)]["warnings"][0]
    )
    assert not sources[("test", 0)]["read"] and "sha256" in sources[("test", 0)]["warnings"][0]
    assert answer["counts"]["total"] == 2


def test_a_document_gone_is_said_not_a_silent_zero():
    bucket = Bucket()
    items = _job(bucket)
    del bucket.objects[(HOME.bucket, items[1]["tests"]["results_key"])]
    answer = job_tests(items, bucket.read, _query())
    build = answer["sources"][0]
    assert build["stage"] == "build" and not build["read"] and "is gone" in build["warnings"][0]
