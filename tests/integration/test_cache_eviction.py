"""A project's caches kept within its cache_limits (relevo_core.caches.eviction) on the local stack's
S3 and table: entries saved past the limit evict the least recently used, an entry unused past the
retention goes, the packs and blobs only evicted entries named are removed and the others' stay,
an entry being restored is not evicted under it, and an entry whose manifest is broken goes so that
its key can be saved again.

The entries are saved and restored with the agent's own cache path (relevo_agent.caches)."""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime, timedelta

import pytest

import relevo_agent.caches as agent_caches
from relevo_core.aws import client
from relevo_core.caches.eviction import GRACE, every_scope, evict, evict_scopes
from relevo_core.models.cache import CacheLimits, CacheSpec, cache_prefix, entry_object
from relevo_core.models.handoff import LARGE_FILE_BYTES
from relevo_core.store import cache_entries
from tests.helpers.stack import register_project
from tests.integration.test_caches import Mac

SPEC = CacheSpec(name="deps", paths=("build",), key="deps-{arch}-{hash:Package.resolved}")
REGION = "eu-west"
ENTRY_BYTES = LARGE_FILE_BYTES + 1000


class SetClock:
    """A clock the test moves (entries' saved and last used times)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _start() -> datetime:
    # After every object the test stores (S3 stamps LastModified with the real time), so that
    # objects count as older than GRACE once the test's clock has moved on.
    return datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)


def _save(mac: Mac, lock: str) -> str:
    """Mac saves the entry of lock file `lock`: a large file (a blob of its own) and a small one."""
    build = mac.workspace / "build"
    build.mkdir(exist_ok=True)
    (mac.workspace / "Package.resolved").write_text(lock)
    (build / "big.bin").write_bytes(os.urandom(LARGE_FILE_BYTES) + b"x" * 999 + b"\n")
    (build / "small.txt").write_text(f"built for {lock}")
    outcome = mac.stage(SPEC)
    assert outcome.save == "saved", outcome
    assert outcome.saved_bytes == ENTRY_BYTES + len(f"built for {lock}")
    return outcome.key


def _stored(stack, project: str) -> set[str]:
    prefix = cache_prefix(project, REGION)
    pages = (
        client("s3")
        .get_paginator("list_objects_v2")
        .paginate(Bucket=stack.resources["ArtifactBucket"], Prefix=prefix)
    )
    return {item["Key"][len(prefix) :] for page in pages for item in page.get("Contents", [])}


def _blobs(stack, project: str, key: str) -> set[str]:
    data = (
        client("s3")
        .get_object(
            Bucket=stack.resources["ArtifactBucket"], Key=cache_prefix(project, REGION) + entry_object(key)
        )["Body"]
        .read()
    )
    from relevo_core.models.cache import CacheEntry

    entry = CacheEntry.model_validate_json(data)
    return {
        item.object
        for tree in entry.trees.values()
        for item in tree.files
        if item.object.startswith("blobs/")
    }


def _keys(stack, project: str) -> set[str]:
    return {
        record.cache_key for record in cache_entries.list_entries(stack.table_name, f"{project}/{REGION}")
    }


@pytest.fixture
def project() -> str:
    return f"evict-{secrets.token_hex(4)}"


def test_entries_saved_past_the_limit_evict_the_least_recently_used_and_only_the_blobs_it_alone_named(
    local_stack, tmp_path, project
):
    # Given three entries saved an hour apart (oldest first: one, two, three) by Mac A
    start = _start()
    clock = SetClock(start)
    a = Mac(local_stack, tmp_path / "mac-a", project, clock=clock)
    keys = []
    for hour, lock in enumerate(("one", "two", "three")):
        clock.now = start + timedelta(hours=hour)
        keys.append(_save(a, lock))
    one, two, three = keys
    blobs = {key: _blobs(local_stack, project, key) for key in keys}
    assert all(len(named) == 1 for named in blobs.values()) and len(set().union(*blobs.values())) == 3
    # and the oldest saved, one, restored since on Mac B (so two is now the least recently used)
    b = Mac(local_stack, tmp_path / "mac-b", project, clock=SetClock(start + timedelta(hours=3)))
    (b.workspace / "Package.resolved").write_text("one")
    _, runs = b.restore(SPEC)
    assert runs[0].outcome.restore == "hit"

    # When eviction runs, hours later, with room for two entries
    limits = CacheLimits(max_total_bytes=2 * ENTRY_BYTES + 100)
    result = evict(
        local_stack.table_name,
        local_stack.resources["ArtifactBucket"],
        project,
        REGION,
        limits,
        start + timedelta(hours=6),
    )

    # Then two (the least recently used, not the oldest saved) is evicted, for size
    assert [(item.key, item.reason) for item in result.evicted] == [(two, "size")]
    assert _keys(local_stack, project) == {one, three}
    assert result.total_before > limits.max_total_bytes >= result.total_after
    # and its manifest and the blob only it named are gone; one's and three's are all still stored
    stored = _stored(local_stack, project)
    assert entry_object(two) not in stored and not blobs[two] & stored
    assert {entry_object(one), entry_object(three)} | blobs[one] | blobs[three] <= stored
    assert result.objects_removed >= 1
    # and the entries kept restore whole on another Mac, the evicted one is a miss
    c = Mac(local_stack, tmp_path / "mac-c", project, clock=SetClock(start + timedelta(hours=7)))
    for lock, wanted in (("one", "hit"), ("three", "hit"), ("two", "miss")):
        (c.workspace / "Package.resolved").write_text(lock)
        _, runs = c.restore(SPEC)
        assert runs[0].outcome.restore == wanted, (lock, runs[0].outcome)


def test_an_entry_unused_past_the_retention_is_evicted_under_the_limit(local_stack, tmp_path, project):
    # Given an entry saved 8 days before another, both well within the size limit
    start = _start()
    clock = SetClock(start)
    a = Mac(local_stack, tmp_path / "mac-a", project, clock=clock)
    old = _save(a, "old")
    clock.now = start + timedelta(days=8)
    new = _save(a, "new")

    # When eviction runs under the default retention (7 days)
    result = evict(
        local_stack.table_name,
        local_stack.resources["ArtifactBucket"],
        project,
        REGION,
        CacheLimits(),
        start + timedelta(days=8, hours=2),
    )

    # Then the old entry is evicted for retention, the new one stays
    assert [(item.key, item.reason) for item in result.evicted] == [(old, "retention")]
    assert _keys(local_stack, project) == {new}


def test_an_entry_being_restored_is_not_evicted_and_its_restore_completes(
    local_stack, tmp_path, project, monkeypatch
):
    # Given two entries, the older one the least recently used, over a limit of one entry
    start = _start()
    clock = SetClock(start)
    a = Mac(local_stack, tmp_path / "mac-a", project, clock=clock)
    old = _save(a, "old")
    clock.now = start + timedelta(hours=1)
    _save(a, "new")
    limits = CacheLimits(max_total_bytes=ENTRY_BYTES + 100)
    when = start + timedelta(hours=5)

    # When Mac B starts restoring the older entry and eviction runs while its bytes are fetched
    results = []
    original = agent_caches._restore_entry

    def evicting_meanwhile(context, record):
        results.append(
            evict(
                local_stack.table_name, local_stack.resources["ArtifactBucket"], project, REGION, limits, when
            )
        )
        return original(context, record)

    monkeypatch.setattr(agent_caches, "_restore_entry", evicting_meanwhile)
    b = Mac(local_stack, tmp_path / "mac-b", project, clock=SetClock(when - timedelta(minutes=1)))
    (b.workspace / "Package.resolved").write_text("old")
    _, runs = b.restore(SPEC)

    # Then the entry being restored is spared (the other, now least recently used, is evicted)
    # and the restore is a whole hit
    assert results and old not in [item.key for item in results[0].evicted]
    assert runs[0].outcome.restore == "hit", runs[0].outcome
    assert (b.workspace / "build" / "big.bin").stat().st_size == ENTRY_BYTES
    assert old in _keys(local_stack, project)


def test_an_entry_restored_after_eviction_read_it_is_not_deleted(local_stack, tmp_path, project):
    # Given an entry's record as eviction read it
    start = _start()
    a = Mac(local_stack, tmp_path / "mac-a", project, clock=SetClock(start))
    key = _save(a, "one")
    scope = f"{project}/{REGION}"
    seen = cache_entries.get_entry(local_stack.table_name, scope, key)
    assert seen is not None

    # When a restore begins before eviction deletes it
    cache_entries.touch(local_stack.table_name, scope, key, (start + timedelta(hours=3)).isoformat())

    # Then the delete is refused (its last_used_at moved) and the entry stays
    assert cache_entries.delete_entry(local_stack.table_name, scope, seen) is False
    assert cache_entries.get_entry(local_stack.table_name, scope, key) is not None


def test_an_entry_whose_manifest_is_broken_is_evicted_so_that_its_key_can_be_saved_again(
    local_stack, tmp_path, project
):
    # Given an entry whose manifest was altered in storage (its restores can only miss)
    start = _start()
    a = Mac(local_stack, tmp_path / "mac-a", project, clock=SetClock(start))
    key = _save(a, "one")
    client("s3").put_object(
        Bucket=local_stack.resources["ArtifactBucket"],
        Key=cache_prefix(project, REGION) + entry_object(key),
        Body=b"{}",
    )

    # When eviction runs, well within the limit
    result = evict(
        local_stack.table_name,
        local_stack.resources["ArtifactBucket"],
        project,
        REGION,
        CacheLimits(),
        start + timedelta(hours=2),
    )

    # Then the entry is evicted as unreadable, and the next save of its key is a save again
    assert [(item.key, item.reason) for item in result.evicted] == [(key, "unreadable")]
    a.clock.now = start + timedelta(hours=3)
    assert _save(a, "one") == key


def test_a_save_in_progress_keeps_its_objects_and_an_old_orphan_goes(local_stack, tmp_path, project):
    # Given an entry, a blob no entry names stored long ago, and one stored just now (a save that
    # has not recorded its entry yet)
    start = _start()
    a = Mac(local_stack, tmp_path / "mac-a", project, clock=SetClock(start))
    _save(a, "one")
    bucket, prefix = local_stack.resources["ArtifactBucket"], cache_prefix(project, REGION)
    orphan = "blobs/" + "a" * 64
    client("s3").put_object(Bucket=bucket, Key=prefix + orphan, Body=b"orphan")

    # When eviction runs less than GRACE after the orphan was stored
    early = evict(
        local_stack.table_name, bucket, project, REGION, CacheLimits(), datetime.now(UTC) + GRACE / 2
    )
    # Then it stays; and when it runs later, it goes
    assert orphan in _stored(local_stack, project) and early.evicted == []
    late = evict(local_stack.table_name, bucket, project, REGION, CacheLimits(), start + timedelta(hours=1))
    assert orphan not in _stored(local_stack, project) and late.objects_removed == 1


def test_the_scheduled_run_finds_every_project_with_caches_and_leaves_a_project_gone(local_stack, tmp_path):
    # Given a registered project that declares a cache, whose entry is unused past its retention
    project = f"evict-{secrets.token_hex(4)}"
    register_project(
        local_stack,
        project,
        [{"name": "build", "run": "true", "cache": ["deps"]}],
        caches=[SPEC.model_dump(mode="json")],
        cache_limits={"retention_days": 1},
    )
    start = _start()
    a = Mac(local_stack, tmp_path / "mac-a", project, clock=SetClock(start))
    key = _save(a, "one")

    # When the scheduled run finds its scopes (and one of a project that is not registered)
    scopes = every_scope(local_stack.table_name, [REGION])
    results = evict_scopes(
        local_stack.table_name,
        local_stack.resources["ArtifactBucket"],
        [*scopes, ("gone-" + secrets.token_hex(3), REGION)],
        start + timedelta(days=2),
    )

    # Then the project's scope is found and its entry evicted under the project's own retention;
    # the project that is gone is left
    assert (project, REGION) in scopes
    mine = [result for result in results if result.scope == f"{project}/{REGION}"]
    assert [(item.key, item.reason) for item in mine[0].evicted] == [(key, "retention")]
    assert not any(result.scope.startswith("gone-") for result in results)
