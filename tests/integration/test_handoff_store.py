"""The handoff's store and restore (relevo_agent.handoff) against the local stack's S3 and table,
as two Macs would run them: what the far side restores is the near side's tree, byte for byte, with
its symlinks, modes, mtimes and empty directories; a same-Mac restore after the checkout's clean
moves 0 bytes; a byte altered in storage, a crafted manifest or a removed object fails the stage
with its own class and writes nothing wrong; a zombie's records are refused; the shards of a stage
store a manifest each, restored together, two of them on one path refused naming both."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relevo_agent.handoff import HandoffFailure
from relevo_agent.handoff.cache import HandoffCache
from relevo_agent.handoff.restore import Source, restore_handoffs
from relevo_agent.handoff.store import handoff_base, store_handoff
from relevo_core.aws import client
from relevo_core.models.errors import ErrorClass
from relevo_core.models.handoff import ENTRY_FIELDS, LARGE_FILE_BYTES, HandoffSummary
from relevo_core.store import artifacts as artifact_store
from relevo_core.store import keys, stage_attempts, stage_claims
from relevo_core.store.codec import from_attributes
from tests.helpers.tree import make_bundle, tree_listing

EXPIRES = 1_900_000_000


def _claimed(
    stack, job_id: str, index: int, stage: str, agent: str = "mac-a", attempt: int = 1
) -> stage_attempts.StageRef:
    ref = stage_attempts.StageRef(stack.table_name, job_id, index, attempt, agent)
    client("dynamodb").put_item(
        TableName=stack.table_name,
        Item={"pk": {"S": f"STAGES#{job_id}"}, "sk": {"S": f"STAGE#{index:02d}"}, "stage_name": {"S": stage}},
    )
    stage_claims.claim(ref, 60, datetime.now(UTC))
    return ref


def _job(stack) -> tuple[str, str]:
    job_id = "job_" + secrets.token_hex(12)
    return job_id, f"s3://{stack.resources['ArtifactBucket']}/handoff-test/{job_id}/"


def _store(
    stack, ref, workspace: Path, patterns: tuple[str, ...], uri: str, lines: list[str], **extra
) -> HandoffSummary:
    return store_handoff(
        ref,
        "build",
        workspace,
        patterns,
        uri,
        EXPIRES,
        {},
        extra.pop("cache", None),
        lines.append,
        threading.Event(),
        **extra,
    )


def test_the_far_side_restores_the_near_sides_tree_exactly(local_stack, tmp_path):
    # Given a bundle on Mac A: symlinks inside it, an executable, an empty directory, odd mtimes,
    # a file over the large-file threshold, and two files with the same bytes
    job_id, uri = _job(local_stack)
    near, far = tmp_path / "mac-a" / "ws", tmp_path / "mac-b" / "ws"
    make_bundle(near, large_bytes=LARGE_FILE_BYTES + 12345)
    handed = ["build/App.app", "build/empty", "build/notes.txt"]
    before = [row for path in handed for row in tree_listing(near, path)]
    ref = _claimed(local_stack, job_id, 0, "build")
    lines: list[str] = []

    # When A stores it and B restores it into a fresh workspace
    summary = _store(local_stack, ref, near, ("build/App.app", "build/empty", "build/*.txt"), uri, lines)
    far.mkdir(parents=True)
    restored = restore_handoffs(
        [Source("build", job_id, summary)],
        far,
        HandoffCache(tmp_path / "mac-b", None),
        lines.append,
        threading.Event(),
        job_id,
    )

    # Then every path is there as it was: type, bytes, mode, mtime (ns), link target
    assert [row for path in handed for row in tree_listing(far, path)] == before
    assert restored.digest == summary.digest
    assert restored.restored_bytes >= summary.bytes - LARGE_FILE_BYTES  # B downloaded it (duplicates once)
    assert (summary.files, summary.symlinks) == (
        before_counts := (
            sum(1 for e in before if e[1] == "file"),
            sum(1 for e in before if e[1] == "symlink"),
        )
    )
    assert before_counts[1] >= 2 and summary.dirs >= 3
    # and the objects are recorded as the job's handoff (kind handoff), fenced on the attempt
    records = [
        r for r in artifact_store.list_artifacts(local_stack.table_name, job_id) if r.kind == "handoff"
    ]
    assert sum(r.size for r in records) == summary.uploaded_bytes
    assert any(r.path.startswith(".relevo-handoff/blobs/") for r in records) and any(
        r.path.startswith(".relevo-handoff/packs/") for r in records
    )
    stage = client("dynamodb").get_item(TableName=local_stack.table_name, Key=ref.key, ConsistentRead=True)[
        "Item"
    ]
    assert stage["handoff_stored"]["M"]["manifest_sha256"]["S"] == summary.manifest_sha256


def test_a_same_mac_restore_after_the_checkouts_clean_moves_no_bytes(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    workspace = tmp_path / "ws"
    make_bundle(workspace, large_bytes=LARGE_FILE_BYTES + 1)
    before = tree_listing(workspace, "build")
    cache = HandoffCache(tmp_path, None)
    summary = _store(
        local_stack, _claimed(local_stack, job_id, 0, "build"), workspace, ("build",), uri, [], cache=cache
    )
    # The next stage's checkout cleans the workspace (git clean -ffdx): the build products are gone.
    shutil.rmtree(workspace / "build")

    restored = restore_handoffs(
        [Source("build", job_id, summary)], workspace, cache, print, threading.Event(), job_id
    )

    assert restored.restored_bytes == 0
    assert restored.cached_bytes == summary.bytes
    assert tree_listing(workspace, "build") == before
    # And with the files still in place (no clean), nothing is copied either: they are verified.
    again = restore_handoffs(
        [Source("build", job_id, summary)], workspace, cache, print, threading.Event(), job_id
    )
    assert (again.restored_bytes, again.cached_bytes, again.present_bytes) == (0, 0, summary.bytes)


def test_an_earlier_jobs_leftovers_inside_a_handed_on_directory_are_removed(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    near, far = tmp_path / "a", tmp_path / "b"
    make_bundle(near)
    summary = _store(
        local_stack, _claimed(local_stack, job_id, 0, "build"), near, ("build/App.app",), uri, []
    )
    # Mac B's workspace still holds an older job's bundle (no checkout: nothing cleaned it).
    (far / "build" / "App.app" / "Old.bundle").mkdir(parents=True)
    (far / "build" / "App.app" / "Info.plist").write_text("an older job's build")

    restore_handoffs([Source("build", job_id, summary)], far, None, print, threading.Event(), job_id)

    assert tree_listing(far, "build/App.app") == tree_listing(near, "build/App.app")
    assert not (far / "build" / "App.app" / "Old.bundle").exists()


def test_a_byte_flipped_in_storage_fails_the_restore_with_checksum(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    near, far = tmp_path / "a", tmp_path / "b"
    make_bundle(near)
    summary = _store(local_stack, _claimed(local_stack, job_id, 0, "build"), near, ("build",), uri, [])
    bucket, prefix = handoff_base(uri)
    pack = next(
        o["Key"] for o in client("s3").list_objects_v2(Bucket=bucket, Prefix=f"{prefix}packs/")["Contents"]
    )
    data = bytearray(client("s3").get_object(Bucket=bucket, Key=pack)["Body"].read())
    data[len(data) // 2] ^= 0x01
    client("s3").put_object(Bucket=bucket, Key=pack, Body=bytes(data))

    with pytest.raises(HandoffFailure) as failed:
        restore_handoffs([Source("build", job_id, summary)], far, None, print, threading.Event(), job_id)

    assert failed.value.error_class is ErrorClass.CHECKSUM and not failed.value.error_class.retryable
    assert "sha256" in failed.value.message
    # Nothing of the altered file is left under its name, nor half-written beside it.
    leftovers = [p for p in far.rglob("*") if ".relevo-" in p.name]
    assert leftovers == []


def test_an_altered_manifest_is_refused_before_anything_of_it_is_used(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    near, far = tmp_path / "a", tmp_path / "b"
    make_bundle(near)
    summary = _store(local_stack, _claimed(local_stack, job_id, 0, "build"), near, ("build",), uri, [])
    bucket, key = summary.manifest.removeprefix("s3://").split("/", 1)
    manifest = json.loads(client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    manifest["entries"][0][0] = "../../outside"
    client("s3").put_object(Bucket=bucket, Key=key, Body=json.dumps(manifest).encode())

    with pytest.raises(HandoffFailure) as failed:
        restore_handoffs([Source("build", job_id, summary)], far, None, print, threading.Event(), job_id)

    assert failed.value.error_class is ErrorClass.CHECKSUM
    assert not (tmp_path / "outside").exists()
    assert not far.exists() or not any(far.iterdir())


def test_a_crafted_manifest_cannot_write_outside_the_workspace(local_stack, tmp_path):
    """A manifest whose sha256 a receipt vouches for (written by a hostile stage's agent) is
    still checked path by path before anything is written."""
    job_id, uri = _job(local_stack)
    bucket, prefix = handoff_base(uri)
    outside = tmp_path / "outside"
    outside.mkdir()
    cases = {
        "climbs out": [
            {
                "path": "../outside/x",
                "type": "file",
                "mode": 0o644,
                "mtime_ns": 1,
                "size": 1,
                "sha256": "0" * 64,
                "object": "packs/" + "0" * 64,
            }
        ],
        "absolute": [
            {
                "path": "/tmp/x",
                "type": "file",
                "mode": 0o644,
                "mtime_ns": 1,
                "size": 1,
                "sha256": "0" * 64,
                "object": "packs/" + "0" * 64,
            }
        ],
        "into .git": [
            {
                "path": ".git/config",
                "type": "file",
                "mode": 0o644,
                "mtime_ns": 1,
                "size": 1,
                "sha256": "0" * 64,
                "object": "packs/" + "0" * 64,
            }
        ],
        "link out, then through it": [
            {"path": "build", "type": "symlink", "mode": 0o777, "mtime_ns": 1, "target": str(outside)},
            {
                "path": "build/x",
                "type": "file",
                "mode": 0o644,
                "mtime_ns": 1,
                "size": 1,
                "sha256": "0" * 64,
                "object": "packs/" + "0" * 64,
            },
        ],
        "relative link out": [
            {"path": "a/b", "type": "symlink", "mode": 0o777, "mtime_ns": 1, "target": "../../outside"}
        ],
        "file under a link": [
            {"path": "lib", "type": "symlink", "mode": 0o777, "mtime_ns": 1, "target": "real"},
            {
                "path": "lib/x",
                "type": "file",
                "mode": 0o644,
                "mtime_ns": 1,
                "size": 1,
                "sha256": "0" * 64,
                "object": "packs/" + "0" * 64,
            },
        ],
    }
    for name, entries in cases.items():
        rows = [
            [entry.get(field, {"size": 0, "offset": 0}.get(field)) for field in ENTRY_FIELDS]
            for entry in entries
        ]
        body = json.dumps(
            {
                "version": 1,
                "job_id": job_id,
                "stage": "build",
                "attempt": 1,
                "patterns": ["build"],
                "entries": rows,
            }
        ).encode()
        key = f"{prefix}manifests/{name.replace(' ', '-').replace(',', '')}.json"
        client("s3").put_object(Bucket=bucket, Key=key, Body=body)
        summary = HandoffSummary(
            manifest=f"s3://{bucket}/{key}",
            manifest_sha256=hashlib.sha256(body).hexdigest(),
            attempt=1,
            digest="0" * 64,
            stored_at="2026-12-02T00:00:00+00:00",
        )
        workspace = tmp_path / f"ws-{len(os.listdir(tmp_path))}"
        workspace.mkdir()
        with pytest.raises(HandoffFailure) as failed:
            restore_handoffs(
                [Source("build", job_id, summary)], workspace, None, print, threading.Event(), job_id
            )
        assert failed.value.error_class is ErrorClass.HANDOFF_PATH, name
        assert list(workspace.iterdir()) == [], name
        assert list(outside.iterdir()) == [], name


def test_a_removed_object_fails_the_restore_as_gone(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    near = tmp_path / "a"
    make_bundle(near)
    summary = _store(local_stack, _claimed(local_stack, job_id, 0, "build"), near, ("build",), uri, [])
    bucket, prefix = handoff_base(uri)
    for listed in client("s3").list_objects_v2(Bucket=bucket, Prefix=f"{prefix}packs/")["Contents"]:
        client("s3").delete_object(Bucket=bucket, Key=listed["Key"])

    with pytest.raises(HandoffFailure) as failed:
        restore_handoffs(
            [Source("build", job_id, summary)], tmp_path / "b", None, print, threading.Event(), job_id
        )
    assert failed.value.error_class is ErrorClass.HANDOFF_GONE


def test_a_later_stage_hands_on_unchanged_files_by_reference(local_stack, tmp_path):
    """Content-addressed: sign re-hands the bundle it restored with one file changed; only that
    file is stored again, the rest point at build's objects."""
    job_id, uri = _job(local_stack)
    near, far = tmp_path / "a", tmp_path / "b"
    make_bundle(near, large_bytes=LARGE_FILE_BYTES + 7)
    build = _store(local_stack, _claimed(local_stack, job_id, 0, "build"), near, ("build",), uri, [])
    far.mkdir()
    restored = restore_handoffs([Source("build", job_id, build)], far, None, print, threading.Event(), job_id)
    (far / "build" / "App.app" / "App").write_bytes(b"signed binary")

    sign_ref = _claimed(local_stack, job_id, 1, "sign", agent="mac-b")
    sign = store_handoff(
        sign_ref, "sign", far, ("build",), uri, EXPIRES, restored.known or {}, None, print, threading.Event()
    )

    assert sign.uploaded_bytes < 64 * 1024, sign  # one small pack and the manifest, no blob again
    later = tmp_path / "c"
    later.mkdir()
    final = restore_handoffs(
        [Source("build", job_id, build), Source("sign", job_id, sign)],
        later,
        None,
        print,
        threading.Event(),
        job_id,
    )
    assert (later / "build" / "App.app" / "App").read_bytes() == b"signed binary"
    assert final.digest == sign.digest


def test_a_declared_path_that_matches_nothing_fails_the_stage(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    workspace = tmp_path / "ws"
    (workspace / "build").mkdir(parents=True)
    with pytest.raises(HandoffFailure) as failed:
        _store(local_stack, _claimed(local_stack, job_id, 0, "build"), workspace, ("build/app.ipa",), uri, [])
    assert failed.value.error_class is ErrorClass.HANDOFF_MISSING
    assert "'build/app.ipa' matched nothing" in failed.value.message


def test_a_symlinked_directory_above_a_handoff_path_is_refused_at_store(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    workspace, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    (elsewhere).mkdir()
    (elsewhere / "secret.txt").write_text("not the workspace's")
    workspace.mkdir()
    os.symlink(elsewhere, workspace / "build")
    with pytest.raises(HandoffFailure) as failed:
        _store(local_stack, _claimed(local_stack, job_id, 0, "build"), workspace, ("build/*.txt",), uri, [])
    assert failed.value.error_class is ErrorClass.HANDOFF_PATH
    # A symlink handed on as such, pointing out of the workspace, is refused too.
    os.unlink(workspace / "build")
    (workspace / "build").mkdir()
    os.symlink(elsewhere / "secret.txt", workspace / "build" / "link")
    with pytest.raises(HandoffFailure) as failed:
        _store(local_stack, _claimed(local_stack, job_id, 0, "build"), workspace, ("build",), uri, [])
    assert failed.value.error_class is ErrorClass.HANDOFF_PATH


def test_a_zombie_attempts_handoff_is_never_recorded(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    workspace = tmp_path / "ws"
    make_bundle(workspace)
    zombie = _claimed(local_stack, job_id, 0, "build", agent="mac-a")
    # Another agent took attempt 2 over after the zombie's lease ended.
    client("dynamodb").update_item(
        TableName=local_stack.table_name,
        Key=zombie.key,
        UpdateExpression="SET lease_expires_at = :past",
        ExpressionAttributeValues={":past": {"N": "1"}},
    )
    stage_claims.claim(
        stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-b"), 60, datetime.now(UTC)
    )

    with pytest.raises(stage_attempts.LeaseLost):
        _store(local_stack, zombie, workspace, ("build",), uri, [])
    assert [
        r for r in artifact_store.list_artifacts(local_stack.table_name, job_id) if r.kind == "handoff"
    ] == []
    stage = client("dynamodb").get_item(
        TableName=local_stack.table_name, Key=zombie.key, ConsistentRead=True
    )["Item"]
    assert "handoff_stored" not in stage


def test_a_handoff_over_the_jobs_artifact_quota_fails_before_anything_is_stored(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    workspace = tmp_path / "ws"
    make_bundle(workspace)
    with pytest.raises(HandoffFailure) as failed:
        _store(
            local_stack,
            _claimed(local_stack, job_id, 0, "build"),
            workspace,
            ("build",),
            uri,
            [],
            max_job_bytes=100,
        )
    assert failed.value.error_class is ErrorClass.ARTIFACT_QUOTA
    bucket, prefix = handoff_base(uri)
    assert client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0) == 0


def test_modes_survive_even_without_write_permission(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    near, far = tmp_path / "a", tmp_path / "b"
    (near / "out" / "ro").mkdir(parents=True)
    (near / "out" / "ro" / "frozen.txt").write_text("read only")
    os.chmod(near / "out" / "ro" / "frozen.txt", 0o444)
    os.chmod(near / "out" / "ro", 0o555)
    (near / "out" / "tool").write_text("#!/bin/sh\necho hi\n")
    os.chmod(near / "out" / "tool", 0o750)
    try:
        summary = _store(local_stack, _claimed(local_stack, job_id, 0, "build"), near, ("out",), uri, [])
        far.mkdir()
        restore_handoffs([Source("build", job_id, summary)], far, None, print, threading.Event(), job_id)
        assert stat.S_IMODE(os.lstat(far / "out" / "ro").st_mode) == 0o555
        assert stat.S_IMODE(os.lstat(far / "out" / "ro" / "frozen.txt").st_mode) == 0o444
        assert stat.S_IMODE(os.lstat(far / "out" / "tool").st_mode) == 0o750
        assert tree_listing(far, "out") == tree_listing(near, "out")
    finally:
        for root in (near, far):
            if (root / "out" / "ro").exists():
                os.chmod(root / "out" / "ro", 0o755)


def _shard_claimed(stack, job_id: str, shard: int) -> stage_attempts.StageRef:
    ref = stage_attempts.StageRef(stack.table_name, job_id, 0, 1, f"mac-{shard}", shard=shard)
    client("dynamodb").put_item(
        TableName=stack.table_name,
        Item={
            "pk": {"S": f"STAGES#{job_id}"},
            "sk": {"S": keys.shard_sk(0, shard)},
            "stage_name": {"S": "build"},
            "shard_index": {"N": str(shard)},
        },
    )
    stage_claims.claim(ref, 60, datetime.now(UTC))
    return ref


def _shards_stored(
    stack, tmp_path: Path, job_id: str, uri: str, same_path: bool = False
) -> list[HandoffSummary]:
    """Two shards of build, each on its own Mac, storing results/<k>/ (or with `same_path`
    results/junit.xml) of bytes of their own."""
    summaries = []
    for shard in range(2):
        workspace = tmp_path / f"mac-{shard}"
        path = workspace / "results" / ("junit.xml" if same_path else f"{shard}/junit.xml")
        path.parent.mkdir(parents=True)
        path.write_text(f"shard {shard}\n")
        summaries.append(
            _store(stack, _shard_claimed(stack, job_id, shard), workspace, ("results",), uri, [])
        )
    return summaries


def test_each_shard_stores_a_manifest_of_its_own_on_its_own_record_and_a_later_stage_restores_both(
    local_stack, tmp_path
):
    job_id, uri = _job(local_stack)
    summaries = _shards_stored(local_stack, tmp_path, job_id, uri)

    assert [summary.manifest.rsplit("/", 1)[1] for summary in summaries] == [
        "build.shard-0.1.json",
        "build.shard-1.1.json",
    ]
    stored = [
        from_attributes(
            client("dynamodb").get_item(TableName=local_stack.table_name, Key=keys.stage_key(job_id, 0, k))[
                "Item"
            ]
        )
        for k in range(2)
    ]
    assert [record["handoff_stored"]["manifest"] for record in stored] == [
        summary.manifest for summary in summaries
    ]
    later = tmp_path / "later"
    restored = restore_handoffs(
        [Source("build", job_id, summary, k) for k, summary in enumerate(summaries)],
        later,
        None,
        print,
        threading.Event(),
        job_id,
    )
    assert restored.from_stages == ("build#shard-0", "build#shard-1") and restored.files == 2
    for shard in range(2):
        assert tree_listing(later, f"results/{shard}") == tree_listing(
            tmp_path / f"mac-{shard}", f"results/{shard}"
        )


def test_a_shards_manifest_altered_in_storage_fails_the_restore_naming_the_shard(local_stack, tmp_path):
    job_id, uri = _job(local_stack)
    summaries = _shards_stored(local_stack, tmp_path, job_id, uri)
    # Shard 1's manifest replaced by shard 0's (a valid manifest of the same job, not the one its receipt
    # names).
    bucket, key = summaries[1].manifest.removeprefix("s3://").split("/", 1)
    other = summaries[0].manifest.removeprefix(f"s3://{bucket}/")
    client("s3").put_object(
        Bucket=bucket, Key=key, Body=client("s3").get_object(Bucket=bucket, Key=other)["Body"].read()
    )

    with pytest.raises(HandoffFailure) as failed:
        restore_handoffs(
            [Source("build", job_id, summary, k) for k, summary in enumerate(summaries)],
            tmp_path / "later",
            None,
            print,
            threading.Event(),
            job_id,
        )

    assert failed.value.error_class is ErrorClass.CHECKSUM
    assert (
        "the manifest of stage build#shard-1" in failed.value.message
        and "altered in storage" in failed.value.message
    )
    assert not (tmp_path / "later" / "results").exists()


def test_two_shards_storing_one_path_differently_are_refused_at_the_restore_before_anything_is_written(
    local_stack, tmp_path
):
    job_id, uri = _job(local_stack)
    summaries = _shards_stored(local_stack, tmp_path, job_id, uri, same_path=True)

    with pytest.raises(HandoffFailure) as refused:
        restore_handoffs(
            [Source("build", job_id, summary, k) for k, summary in enumerate(summaries)],
            tmp_path / "later",
            None,
            print,
            threading.Event(),
            job_id,
        )

    assert (
        refused.value.error_class is ErrorClass.HANDOFF_CONFLICT and not refused.value.error_class.retryable
    )
    assert (
        f"shards build#shard-0 and build#shard-1 of {job_id} both hand on 'results/junit.xml' (differently)"
        in refused.value.message
    )
    assert not (tmp_path / "later" / "results").exists()


def test_a_shards_handoff_quota_counts_its_siblings_handoffs_and_not_its_own_earlier_attempt(
    local_stack, tmp_path
):
    """artifact.max_job_bytes for a shard's handoff: a sibling shard's stored objects are the
    job's as much as another stage's (the check once left out every record of its stage's name);
    the shard's own earlier attempt's are replaced by its retry, so they do not count."""
    job_id, uri = _job(local_stack)
    first = tmp_path / "mac-0"
    (first / "results").mkdir(parents=True)
    (first / "results" / "0.bin").write_bytes(b"0" * 3000)
    store_handoff(
        _shard_claimed(local_stack, job_id, 0),
        "build",
        first,
        ("results",),
        uri,
        EXPIRES,
        {},
        None,
        print,
        threading.Event(),
        max_job_bytes=5000,
    )
    records = artifact_store.list_artifacts(local_stack.table_name, job_id)
    assert {record.shard for record in records} == {0} and sum(
        record.size for record in records
    ) > 3000  # the pack and its manifest

    second = tmp_path / "mac-1"
    (second / "results").mkdir(parents=True)
    (second / "results" / "1.bin").write_bytes(b"1" * 2500)
    with pytest.raises(HandoffFailure) as refused:
        store_handoff(
            _shard_claimed(local_stack, job_id, 1),
            "build",
            second,
            ("results",),
            uri,
            EXPIRES,
            {},
            None,
            print,
            threading.Event(),
            max_job_bytes=5000,
        )
    assert refused.value.error_class is ErrorClass.ARTIFACT_QUOTA
    assert "over the project's artifact.max_job_bytes 5000 (other stages and shards: " in str(refused.value)
    assert {record.shard for record in artifact_store.list_artifacts(local_stack.table_name, job_id)} == {0}

    # Shard 0's retry storing the same amount again: its first attempt's objects do not count.
    retry = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-0", shard=0)
    stage_claims.claim(retry, 60, datetime.now(UTC))
    (first / "results" / "0.bin").write_bytes(b"2" * 3000)
    store_handoff(
        retry,
        "build",
        first,
        ("results",),
        uri,
        EXPIRES,
        {},
        None,
        print,
        threading.Event(),
        max_job_bytes=5000,
    )
