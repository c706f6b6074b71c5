"""A project's caches (relevo_agent.caches) against the local stack's S3 and table, as two Macs of
a region would use them: an entry saved on one is restored on the other exactly (the handoff's
tree digest), a warm Mac downloads nothing, a changed lock file misses, a restore key gives a
partial hit whose new key uploads only what changed, another Xcode build misses, a corrupt or
partly missing entry is a miss that leaves the workspace as it was, two saves of one key leave
one whole entry, and a job whose ref may not write saves nothing."""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from relevo_agent.caches import CacheContext, restore_caches, save_caches
from relevo_agent.handoff.cache import HandoffCache
from relevo_core.aws import client
from relevo_core.models.cache import CacheSpec, cache_prefix, entry_object
from relevo_core.models.handoff import LARGE_FILE_BYTES
from relevo_core.store import cache_entries
from relevo_core.store.stage_attempts import StageRef
from tests.helpers.tree import make_bundle, tree_listing

XCODE_16 = {"os": "darwin", "arch": "arm64", "macos": "15.2", "xcode": "16.2", "xcode_build": "16C5032a"}
DEPS = CacheSpec(
    name="deps",
    paths=("build", "~/Library/Caches/tool"),
    key="deps-{xcode_build}-{arch}-{hash:Package.resolved}",
    restore_keys=("deps-{xcode_build}-{arch}-",),
)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


class Mac:
    """One Mac of the region: its workspace root (and content cache) and the build user's home."""

    def __init__(self, stack, root: Path, project: str, facts=XCODE_16, writable=True, clock=None) -> None:
        self.stack, self.root, self.project = stack, root, project
        self.facts, self.writable, self.clock = dict(facts), writable, clock or Clock()
        self.workspace, self.home = root / "ws" / project, root / "home"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []

    def context(self) -> CacheContext:
        ref = StageRef(self.stack.table_name, "job_" + secrets.token_hex(12), 0, 1, self.root.name)
        return CacheContext(
            ref=ref,
            stage="build",
            bucket=self.stack.resources["ArtifactBucket"],
            project=self.project,
            region="eu-west",
            workspace=self.workspace,
            home=self.home,
            facts=self.facts,
            writable=self.writable,
            content_cache=HandoffCache(self.root / "ws", None),
            emit=self.lines.append,
            cancel=threading.Event(),
            clock=self.clock,
        )

    def restore(self, spec: CacheSpec = DEPS):
        context = self.context()
        return context, restore_caches((spec,), context)

    def stage(self, spec: CacheSpec = DEPS, succeeded: bool = True):
        """A stage with the cache: restore, (the command ran), save."""
        context, runs = self.restore(spec)
        save_caches(runs, context, succeeded)
        return runs[0].outcome


def _project() -> str:
    return f"cache-{secrets.token_hex(4)}"


def _build(mac: Mac, resolved: str = "pins: a 1.0\n", large: int = 0) -> None:
    (mac.workspace / "Package.resolved").write_text(resolved)
    make_bundle(mac.workspace, large_bytes=large)
    tool = mac.home / "Library" / "Caches" / "tool"
    tool.mkdir(parents=True, exist_ok=True)
    (tool / "index.db").write_bytes(b"index" * 1000)


def _listing(mac: Mac) -> list[tuple[str, ...]]:
    return tree_listing(mac.workspace, "build") + tree_listing(mac.home, "Library/Caches/tool")


def test_an_entry_saved_on_one_mac_is_restored_exactly_on_another_and_a_warm_mac_downloads_nothing(
    local_stack, tmp_path
):
    # Given Mac A built the dependencies (links, modes, mtimes, a large file) and saved the cache
    project = _project()
    a, b = Mac(local_stack, tmp_path / "mac-a", project), Mac(local_stack, tmp_path / "mac-b", project)
    _build(a, large=LARGE_FILE_BYTES + 99)
    # and a link out of the tree, as a virtual environment's bin/python is (kept as a link)
    (a.workspace / "build" / "python").symlink_to("/usr/bin/python3")
    saved = a.stage()
    assert (saved.restore, saved.save) == ("miss", "saved") and saved.uploaded_bytes > LARGE_FILE_BYTES
    wanted = _listing(a)

    # When Mac B, with the same lock file and Xcode, restores it into a fresh workspace
    (b.workspace / "Package.resolved").write_text("pins: a 1.0\n")
    _, runs = b.restore()

    # Then every path is there as A left it (type, bytes, mode, mtime, link target), under the
    # workspace and the home, and B downloaded the bytes
    outcome = runs[0].outcome
    assert (outcome.restore, outcome.restored_key) == ("hit", saved.key)
    assert _listing(b) == wanted and outcome.digest == saved.digest
    assert os.readlink(b.workspace / "build" / "python") == "/usr/bin/python3"
    assert outcome.downloaded_bytes >= LARGE_FILE_BYTES and outcome.bytes == saved.saved_bytes
    assert any(line.startswith("[relevo] cache deps: hit ") for line in b.lines)
    # and the hit is counted on the entry's record
    record = cache_entries.get_entry(local_stack.table_name, f"{project}/eu-west", saved.key)
    assert record is not None and record.hits == 1

    # When A, whose checkout's clean removed the build, restores it again
    import shutil

    shutil.rmtree(a.workspace / "build")
    _, again = a.restore()

    # Then it comes from A's own content cache: 0 bytes downloaded, the tree exact
    assert again[0].outcome.restore == "hit" and again[0].outcome.downloaded_bytes == 0
    assert _listing(a) == wanted


def test_a_changed_lock_file_misses_and_a_restore_key_gives_a_partial_hit_that_uploads_only_the_change(
    local_stack, tmp_path
):
    # Given an entry saved under the old lock file
    project = _project()
    a, b = Mac(local_stack, tmp_path / "mac-a", project), Mac(local_stack, tmp_path / "mac-b", project)
    _build(a, large=LARGE_FILE_BYTES + 7)
    first = a.stage()

    # When B's lock file differs (its key misses) and the restore key finds the older entry
    (b.workspace / "Package.resolved").write_text("pins: a 2.0\n")
    context, runs = b.restore()

    # Then it is a partial hit of the older key, restored whole
    outcome = runs[0].outcome
    assert outcome.key != first.key
    assert (outcome.restore, outcome.restored_key) == ("partial", first.key)
    assert _listing(b) == _listing(a)

    # When B's command changes one small file and the stage saves the new key
    (b.workspace / "build" / "notes.txt").write_text("rebuilt\n")
    save_caches(runs, context, succeeded=True)

    # Then only the changed bytes were sent (the large blob and the rest are the older entry's)
    saved = runs[0].outcome
    assert saved.save == "saved" and 0 < saved.uploaded_bytes < 1024 * 1024
    # and without a restore key a changed lock file is a plain miss
    bare = DEPS.model_copy(update={"restore_keys": ()})
    (b.workspace / "Package.resolved").write_text("pins: a 3.0\n")
    _, misses = b.restore(bare)
    assert misses[0].outcome.restore == "miss" and misses[0].outcome.downloaded_bytes == 0


def test_a_cache_saved_under_one_xcode_build_is_not_restored_under_another(local_stack, tmp_path):
    # Given an entry saved by a Mac with Xcode 16.2 (16C5032a)
    project = _project()
    a = Mac(local_stack, tmp_path / "mac-a", project)
    _build(a)
    assert a.stage().save == "saved"

    # When a Mac with another Xcode build restores with the same lock file
    b = Mac(local_stack, tmp_path / "mac-b", project, facts={**XCODE_16, "xcode_build": "16C5031c"})
    (b.workspace / "Package.resolved").write_text("pins: a 1.0\n")
    _, runs = b.restore()

    # Then it misses (its restore key names the build too), and nothing was written
    assert runs[0].outcome.restore == "miss"
    assert not (b.workspace / "build").exists()


@pytest.mark.parametrize("damage", ["manifest", "blob"])
def test_a_corrupt_or_partly_missing_entry_is_a_miss_and_leaves_the_workspace_as_it_was(
    local_stack, tmp_path, damage
):
    # Given a saved entry, then damaged in storage: its manifest altered, or its large blob gone
    project = _project()
    a = Mac(local_stack, tmp_path / "mac-a", project)
    _build(a, large=LARGE_FILE_BYTES + 3)
    saved = a.stage()
    s3, bucket, prefix = (
        client("s3"),
        local_stack.resources["ArtifactBucket"],
        cache_prefix(project, "eu-west"),
    )
    if damage == "manifest":
        name = prefix + entry_object(saved.key)
        body = s3.get_object(Bucket=bucket, Key=name)["Body"].read()
        s3.put_object(Bucket=bucket, Key=name, Body=body.replace(b'"build/notes.txt"', b'"build/motes.txt"'))
    else:
        blobs = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "blobs/")["Contents"]
        for blob in blobs:
            s3.delete_object(Bucket=bucket, Key=blob["Key"])

    # When Mac B, whose workspace holds an older build, restores
    b = Mac(local_stack, tmp_path / "mac-b", project)
    (b.workspace / "Package.resolved").write_text("pins: a 1.0\n")
    (b.workspace / "build").mkdir()
    (b.workspace / "build" / "old.txt").write_text("older build\n")
    before = tree_listing(b.workspace, "build")
    _, runs = b.restore()

    # Then it is a miss, logged with why, and the workspace is untouched (no half-restored tree,
    # no staging directory left)
    outcome = runs[0].outcome
    assert outcome.restore == "miss" and outcome.reason
    assert any("cache deps: miss: the entry could not be restored" in line for line in b.lines)
    assert tree_listing(b.workspace, "build") == before
    assert not (b.workspace / ".relevo-cache-staging").exists()


def test_two_concurrent_saves_of_one_key_leave_one_whole_entry(local_stack, tmp_path):
    # Given two Macs that built the same key with different bytes (a build is not reproducible)
    project = _project()
    a, b = Mac(local_stack, tmp_path / "mac-a", project), Mac(local_stack, tmp_path / "mac-b", project)
    _build(a)
    _build(b, large=LARGE_FILE_BYTES + 1)
    contexts = [a.restore(), b.restore()]
    assert all(runs[0].outcome.restore == "miss" for _, runs in contexts)

    # When both save it at once
    barrier = threading.Barrier(2)

    def save(pair) -> None:
        barrier.wait()
        save_caches(pair[1], pair[0], succeeded=True)

    threads = [threading.Thread(target=save, args=(pair,)) for pair in contexts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then one saved it and the other found it saved: one entry, its record naming its manifest
    outcomes = sorted(runs[0].outcome.save for _, runs in contexts)
    assert outcomes == ["exists", "saved"]
    key = contexts[0][1][0].key
    record = cache_entries.get_entry(local_stack.table_name, f"{project}/eu-west", key)
    body = (
        client("s3")
        .get_object(
            Bucket=local_stack.resources["ArtifactBucket"],
            Key=cache_prefix(project, "eu-west") + entry_object(key),
        )["Body"]
        .read()
    )
    assert record is not None and record.manifest_sha256 == hashlib.sha256(body).hexdigest()
    # and a third Mac restores it whole: one of the two trees, exactly
    c = Mac(local_stack, tmp_path / "mac-c", project)
    (c.workspace / "Package.resolved").write_text("pins: a 1.0\n")
    _, runs = c.restore()
    assert runs[0].outcome.restore == "hit"
    assert _listing(c) in (_listing(a), _listing(b))


def test_a_job_whose_ref_may_not_write_restores_but_saves_nothing(local_stack, tmp_path):
    # Given a pull request's job (cache_write false) on a project with no entry
    project = _project()
    pr = Mac(local_stack, tmp_path / "mac-pr", project, writable=False)
    _build(pr)

    # When its stage succeeds
    outcome = pr.stage()

    # Then nothing is stored: no entry, no record
    assert (outcome.restore, outcome.save) == ("miss", "not_saved")
    listed = client("s3").list_objects_v2(
        Bucket=local_stack.resources["ArtifactBucket"], Prefix=cache_prefix(project, "eu-west")
    )
    assert listed.get("KeyCount", 0) == 0
    assert cache_entries.newest_with_prefix(local_stack.table_name, f"{project}/eu-west", "deps/") is None


def test_a_restore_never_moves_a_tree_through_a_symlink_of_the_workspace(local_stack, tmp_path):
    # Given an entry of `vendor/deps`, saved by Mac A
    project = _project()
    spec = CacheSpec(name="vendor", paths=("vendor/deps",), key="vendor-{hash:Package.resolved}")
    a = Mac(local_stack, tmp_path / "mac-a", project)
    (a.workspace / "Package.resolved").write_text("pins\n")
    (a.workspace / "vendor" / "deps").mkdir(parents=True)
    (a.workspace / "vendor" / "deps" / "lib.txt").write_text("lib\n")
    assert a.stage(spec).save == "saved"

    # When Mac B's workspace has `vendor` as a symlink to a directory outside it
    b = Mac(local_stack, tmp_path / "mac-b", project)
    (b.workspace / "Package.resolved").write_text("pins\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (b.workspace / "vendor").symlink_to(outside)
    _, runs = b.restore(spec)

    # Then it is a miss, and nothing was written outside the workspace
    assert runs[0].outcome.restore == "miss" and "symlink" in (runs[0].outcome.reason or "")
    assert list(outside.iterdir()) == []


def test_a_save_that_lost_the_race_leaves_the_first_entry_whole(local_stack, tmp_path):
    # Given Mac B restored (a miss) before Mac A saved the same key with other bytes
    project = _project()
    a, b = Mac(local_stack, tmp_path / "mac-a", project), Mac(local_stack, tmp_path / "mac-b", project)
    _build(a)
    _build(b, large=LARGE_FILE_BYTES + 5)
    b_context, b_runs = b.restore()
    assert b_runs[0].outcome.restore == "miss"
    assert a.stage().save == "saved"
    wanted = _listing(a)

    # When B saves it afterwards
    save_caches(b_runs, b_context, succeeded=True)

    # Then B's put of the entry is refused (412) and A's entry stays: a third Mac restores A's tree
    assert b_runs[0].outcome.save == "exists"
    c = Mac(local_stack, tmp_path / "mac-c", project)
    (c.workspace / "Package.resolved").write_text("pins: a 1.0\n")
    _, runs = c.restore()
    assert runs[0].outcome.restore == "hit" and _listing(c) == wanted


@pytest.mark.parametrize("save, saved", [("on_success", None), ("always", "saved")])
def test_after_a_failed_command_a_cache_is_saved_only_when_it_says_always(local_stack, tmp_path, save, saved):
    # Given a cache with `save`, and a stage whose command failed
    project = _project()
    mac = Mac(local_stack, tmp_path / "mac-a", project)
    _build(mac)

    # When the stage ends
    outcome = mac.stage(DEPS.model_copy(update={"save": save}), succeeded=False)

    # Then it was saved only with `always`
    assert outcome.save == saved


def test_an_entry_names_the_macs_that_saved_and_restored_it_the_most_recent_ones_only(local_stack):
    """Placement by cache (relevo_core.fleet.warm_macs) reads these names (store.cache_holders)."""
    from relevo_core.store.cache_holders import recent_holders

    table, scope = local_stack.table_name, f"{_project()}/eu-west"

    def at(minute: int) -> str:
        return f"2026-12-01T10:{minute:02d}:00+00:00"

    def entry(key: str) -> cache_entries.CacheEntryRecord:
        return cache_entries.CacheEntryRecord(key, "0" * 64, 1, 1, at(0), "job_x", "build", at(0))

    # Given an entry saved by mac-0, and one recorded without its saver's name
    assert cache_entries.put_entry(table, scope, entry("deps/a"), "mac-0")
    assert cache_entries.put_entry(table, scope, entry("deps/b"))
    # When 11 more Macs restore the first one after the other, and one Mac restores the second
    for n in range(1, 12):
        cache_entries.count_hit(table, scope, "deps/a", at(n), f"mac-{n}")
    cache_entries.count_hit(table, scope, "deps/b", at(30), "mac-x")
    # and a restore counts a hit on an entry evicted meanwhile
    cache_entries.count_hit(table, scope, "deps/gone", at(31), "mac-y")

    # Then each entry names the most recent MAX_HOLDERS Macs that saved or restored it, with when,
    # and every hit is counted once
    holders = recent_holders(table, scope, ["deps"])
    newest = {f"mac-{n}": at(n) for n in range(12 - cache_entries.MAX_HOLDERS, 12)}
    assert holders == {**newest, "mac-x": at(30)}
    assert cache_entries.get_entry(table, scope, "deps/a").hits == 11
    assert cache_entries.get_entry(table, scope, "deps/b").hits == 1
    # and the evicted entry stays gone; another cache's name reads none of them
    assert cache_entries.get_entry(table, scope, "deps/gone") is None
    assert recent_holders(table, scope, ["spm"]) == {}


def test_with_a_build_user_a_restore_puts_its_home_paths_in_that_users_home_owned_by_it(
    local_stack, build_user, shared_dir
):
    """Issue 46: with `run_as`, paths under `~/` are the build user's home's, and what a restore
    puts there (and in the workspace) is that user's, or its command could not write its cache."""
    import dataclasses

    # Given Mac A saved the cache (its home holds ~/Library/Caches/tool)
    project = _project()
    a = Mac(local_stack, shared_dir / "mac-a", project)
    _build(a)
    (a.home / "Library" / "Caches" / "tool" / "current").symlink_to("index.db")
    saved = a.stage()
    assert saved.save == "saved"
    # and Mac B runs its stages as a build user, whose home and workspace are its own, no
    # ~/Library there yet
    b = Mac(local_stack, shared_dir / "mac-b", project)
    (b.workspace / "Package.resolved").write_text("pins: a 1.0\n")
    for path in (b.home, b.workspace, b.workspace / "Package.resolved"):
        os.chown(path, build_user.uid, build_user.gid)

    # When Mac B's agent (root) restores it for a stage run as that user
    context = dataclasses.replace(b.context(), owner=build_user)
    runs = restore_caches((DEPS,), context)

    # Then the tree is as A left it, and every path it made, the directories above the declared
    # one included, is the build user's
    assert runs[0].outcome.restore == "hit" and _listing(b) == _listing(a)
    made = [b.home / "Library", *(b.home / "Library").rglob("*"), *(b.workspace / "build").rglob("*")]
    not_its = [str(path) for path in made + [b.workspace / "build"] if path.lstat().st_uid != build_user.uid]
    assert len(made) > 5 and not_its == []
    assert not (b.home / ".relevo-cache-staging").exists()
