"""Shards' logs on partitions of their own (relevo_core.store.keys.log_partition), on the local
stack: two shards of one job logging side by side never share a seq nor retry one, and the job's
log reads their partitions merged by time, each shard's order kept, through the API's pages
forward and back (a page boundary between two shards' lines), the job view's tail and `relevo
job logs -f` following the job while the shards write.

Why partitions of their own: DynamoDB limits a partition to 1,000 write units a second, and a
transaction's write costs two ("Best practices for designing and using partition keys
effectively", DynamoDB Developer Guide); shards writing one job's log shared that and its seq."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from relevo_cli.api import RelevoApi
from relevo_cli.follow import LogFollower
from relevo_core.store.keys import log_pk
from relevo_core.store.log_chunks import ChunkWriter
from tests.helpers.stack import table_items, wait_for_execution
from tests.helpers.state_machine import start_job
from tests.integration.test_parallel_stages import claim_shard, report, stage_messages

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TEST = {"name": "test", "run": "make test", "parallel": 2}


def _shards(stack, project_id: str) -> tuple[str, list]:
    """A job of one stage with two shards, each claimed by a Mac of its own: (job, [(ref, run token)])."""
    job_id = start_job(stack, project_id, [TEST])
    return job_id, [
        claim_shard(stack, task, f"mac-{task['shard']}") for task in stage_messages(stack, job_id, 2)
    ]


def _writers(runs: list) -> list[ChunkWriter]:
    return [ChunkWriter(ref, "test", expires_at=1_900_000_000) for ref, _ in runs]


def _partition(stack, pk: str) -> list[dict]:
    return [item for item in table_items(stack, pk) if item["pk"]["S"] == pk]


def _seqs(stack, pk: str) -> list[int]:
    return sorted(int(item["seq"]["N"]) for item in _partition(stack, pk))


def test_two_shards_logging_side_by_side_write_partitions_of_their_own_without_a_collision(
    local_stack, project_id
):
    # Given two shards of one job, each with its writer (each starts after its partition's stored tail)
    job_id, runs = _shards(local_stack, project_id)
    zero, one = _writers(runs)
    # When they append in turn, each before the other's last chunk is seen (as two Macs do)
    for i in range(6):
        zero.append(f"zero {i}\n", T0 + timedelta(seconds=2 * i))
        one.append(f"one {i}\n", T0 + timedelta(seconds=2 * i + 1))
    # Then no transaction was refused for a taken seq: nothing was read again or retried
    assert (zero.collisions, one.collisions) == (0, 0)
    assert (zero.transactions, one.transactions) == (6, 6)
    # And each shard's chunks are in its own partition, seqs 0 to 5, the job's own partition empty
    assert _seqs(local_stack, log_pk(job_id, 0, 0)) == list(range(6))
    assert _seqs(local_stack, log_pk(job_id, 0, 1)) == list(range(6))
    assert _partition(local_stack, log_pk(job_id)) == []
    # And both carry the job's log TTL
    assert {item["ttl"]["N"] for item in table_items(local_stack, log_pk(job_id, 0, 1))} == {"1900000000"}


def _texts(chunks: list[dict]) -> list[str]:
    return [chunk["text"] for chunk in chunks]


def test_the_jobs_log_merges_its_shards_by_time_across_pages_back_and_forth_the_tail_and_a_follower(
    local_stack, project_id
):
    # Given two shards whose lines interleave in time, shard 1's first line stored after shard 0's
    # second (its Mac shipped it late), and shard 1 writing two lines in a row at one point
    job_id, runs = _shards(local_stack, project_id)
    zero, one = _writers(runs)
    zero.append("zero 0\n", T0)
    zero.append("zero 1\n", T0 + timedelta(seconds=2))
    one.append("one 0\n", T0 + timedelta(seconds=1))
    one.append("one 1\n", T0 + timedelta(seconds=3))
    one.append("one 2\n", T0 + timedelta(seconds=4))
    zero.append("zero 2\n", T0 + timedelta(seconds=5))
    merged = ["zero 0\n", "one 0\n", "zero 1\n", "one 1\n", "one 2\n", "zero 2\n"]
    api = RelevoApi.for_stack(local_stack)

    # When the log is paged forward 3 chunks at a time (the boundary falls between zero 1 and one 1)
    pages, cursor = [], 0
    while True:
        page = api.job_logs(job_id, from_seq=cursor, limit=3)
        pages.append(_texts(page["chunks"]))
        cursor = page["next_seq"]
        if not page["more"]:
            break
    # Then the pages hold every line once, in time order, each shard's lines in their order
    assert pages == [merged[:3], merged[3:]]
    assert [chunk["shard"] for chunk in api.job_logs(job_id, limit=6)["chunks"]] == [0, 1, 0, 1, 1, 0]
    # And a cursor names each shard's place (the job's own partition holds nothing yet)
    assert api.job_logs(job_id, limit=3)["next_seq"] == "0,00.00:2,00.01:1"

    # When it is paged back 2 chunks at a time from the end (where paging forward ended)
    end = cursor
    assert end == "0,00.00:3,00.01:3"
    back, before = [], end
    while before is not None:
        page = api.job_logs(job_id, before_seq=before, limit=2)
        back[:0] = _texts(page["chunks"])
        before = page["before_seq"]
    # Then it reads the same lines in the same order, and a page back meets the page forward
    assert back == merged
    middle = api.job_logs(job_id, before_seq=end, limit=2)["before_seq"]
    assert _texts(api.job_logs(job_id, from_seq=middle)["chunks"]) == merged[4:]

    # And the job view's tail shows both shards' lines in that order, and its cursor is the log's end
    tail = api.get_job(job_id)["log_tail"]
    assert [(line.get("shard"), line["text"]) for line in tail["lines"]] == [
        (int(t.startswith("one")), t.strip()) for t in merged
    ]
    assert api.job_logs(job_id, from_seq=tail["next_seq"])["chunks"] == []

    # When `relevo job logs -f` follows the job from the tail while both shards write on, and the shards end
    printed: list[str] = []
    later = iter(
        [
            lambda: one.append("one 3\n", T0 + timedelta(seconds=6)),
            lambda: zero.append("zero 3\n", T0 + timedelta(seconds=7)),
            lambda: (
                one.append("one 4\n", T0 + timedelta(seconds=8)),
                zero.append("zero 4\n", T0 + timedelta(seconds=9)),
            ),
            lambda: [report(ref, token, succeed=True) for ref, token in runs]
            and wait_for_execution(local_stack, job_id),
        ]
    )

    def fetch(cursor):
        page = api.job_logs(job_id, from_seq=cursor, limit=1)
        if not page["more"]:
            step = next(later, None)
            if step is not None:
                step()
        return page

    follower = LogFollower(fetch=fetch, write=printed.append, sleep=lambda _: None, next_seq=tail["next_seq"])
    code = follower.run(follow=True)
    # Then it printed each new line once, in time order, and exited with the job's outcome
    assert (code, printed) == (0, ["one 3\n", "zero 3\n", "one 4\n", "zero 4\n"])
