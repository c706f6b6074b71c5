"""The handoff's manifest without any storage: what a tree's scan records (types, modes, mtimes,
link targets, empty directories), the tree digest, the path rules a project file and a crafted
manifest meet, and how later stages' manifests win over earlier ones."""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from relevo_agent.handoff import HandoffFailure
from relevo_agent.handoff.manifests import Source, check_shards_apart
from relevo_agent.handoff.restore import check_entries, merge
from relevo_agent.handoff.tree import scan
from relevo_core.models.errors import ErrorClass
from relevo_core.models.handoff import (
    HandoffSummary,
    Manifest,
    ManifestEntry,
    link_target_problem,
    path_problem,
    tree_digest,
)
from relevo_core.models.project import Project
from tests.helpers.tree import make_bundle

SHA = "a" * 64


def _file(path: str, **extra) -> ManifestEntry:
    fields = {"mode": 0o644, "mtime_ns": 1, "size": 1, "sha256": SHA, "object": "packs/" + SHA, **extra}
    return ManifestEntry(path=path, type="file", **fields)


def test_a_scan_records_every_path_of_a_bundle_as_it_is(tmp_path: Path) -> None:
    make_bundle(tmp_path)
    found = {entry.path: entry for entry in scan(tmp_path, ("build/App.app", "build/empty"))}
    app = "build/App.app"
    assert found[f"{app}/App"].type == "file" and found[f"{app}/App"].mode == 0o755
    assert found[f"{app}/fr.lproj.strings"].mode == 0o640
    link = found[f"{app}/Frameworks/Kit.framework/Versions/Current"]
    assert (link.type, link.target) == ("symlink", "A")
    assert found["build/empty"].type == "dir"
    for path, entry in found.items():
        info = os.lstat(tmp_path / path)
        assert entry.mtime_ns == info.st_mtime_ns, path  # nanoseconds, not seconds
        if entry.type != "symlink":
            assert entry.mode == stat.S_IMODE(info.st_mode), path
    # Nothing outside what the patterns name.
    assert "build/notes.txt" not in found


def test_the_tree_digest_changes_with_any_byte_mode_time_or_link(tmp_path: Path) -> None:
    entries = [
        ManifestEntry(path="a", type="dir", mode=0o755, mtime_ns=5),
        _file("a/x"),
        ManifestEntry(path="a/l", type="symlink", mode=0o777, mtime_ns=3, target="x"),
    ]
    base = tree_digest(entries)
    assert tree_digest(list(reversed(entries))) == base  # order does not matter
    variants = [
        [entries[0], replace(_file("a/x"), sha256="b" * 64), entries[2]],
        [entries[0], replace(_file("a/x"), mode=0o755), entries[2]],
        [entries[0], replace(_file("a/x"), mtime_ns=2), entries[2]],
        [entries[0], entries[1], replace(entries[2], target="y")],
        [replace(entries[0], mtime_ns=6), entries[1], entries[2]],
    ]
    assert all(tree_digest(variant) != base for variant in variants)
    # A symlink's own mode is not part of it (Linux has none of its own).
    assert tree_digest([entries[0], entries[1], replace(entries[2], mode=0o755)]) == base


@pytest.mark.parametrize(
    "path, problem",
    [
        ("../x", "climbs out"),
        ("build/../../x", "climbs out"),
        ("/etc/passwd", "absolute"),
        ("~/x", "starts with ~"),
        (".git/config", ".git"),
        ("sub/.git/hooks/post-checkout", ".git"),
        ("a//b", "empty"),
        ("a/./b", "empty or '.'"),
        ("a\0b", "NUL"),
        ("a\nb", "line break"),
        ("", "empty"),
    ],
)
def test_paths_that_could_leave_the_workspace_are_refused(path: str, problem: str) -> None:
    found = path_problem(path)
    assert found is not None and problem in found


@pytest.mark.parametrize(
    "path", ["build/App.app", "build/*.ipa", "**/*.dSYM", ".build/out", "a b/c", "build/..x"]
)
def test_ordinary_paths_and_globs_pass(path: str) -> None:
    assert path_problem(path, pattern=True) is None


@pytest.mark.parametrize(
    "path, target, ok",
    [
        ("F.framework/Versions/Current", "A", True),
        ("F.framework/F", "Versions/Current/F", True),
        ("a/b/c", "../../x", True),
        ("a/b", "../../x", False),
        ("a", "/usr/lib/libz.dylib", False),
        ("a/l", "../.git/config", False),
        ("a", "", False),
    ],
)
def test_symlink_targets_stay_inside_the_workspace(path: str, target: str, ok: bool) -> None:
    assert (link_target_problem(path, target) is None) is ok


def test_a_project_file_with_an_escaping_handoff_path_is_refused_naming_it() -> None:
    with pytest.raises(ValueError) as refused:
        Project.model_validate(
            {
                "id": "p",
                "repo": "a/b",
                "region_affinity": "eu-west",
                "stages": [{"name": "build", "run": "x", "handoff": ["ok", "../up"]}],
            }
        )
    errors = refused.value.errors()  # type: ignore[attr-defined]  # a ValidationError
    assert errors[0]["loc"] == ("stages", 0, "handoff", 1)
    assert "climbs out" in errors[0]["msg"]


@pytest.mark.parametrize(
    "entries, what",
    [
        ([_file("../outside")], "climbs out"),
        ([_file("/tmp/x")], "absolute"),
        ([_file(".git/config")], ".git"),
        ([_file("a"), _file("a")], "twice"),
        (
            [
                ManifestEntry(path="lib", type="symlink", mode=0o777, mtime_ns=1, target="/etc"),
                _file("lib/passwd"),
            ],
            "symlink that",
        ),
        (
            [
                ManifestEntry(path="lib", type="symlink", mode=0o777, mtime_ns=1, target="real"),
                _file("lib/x"),
            ],
            "under 'lib', a symlink",
        ),
        ([_file("a"), _file("a/b")], "under 'a', a file"),
        ([ManifestEntry(path="x", type="file", mode=0o644, mtime_ns=1, size=3)], "without its sha256"),
    ],
)
def test_a_crafted_manifest_is_refused_before_anything_is_written(
    entries: list[ManifestEntry], what: str
) -> None:
    with pytest.raises(HandoffFailure) as refused:
        check_entries("build", tuple(entries))
    assert refused.value.error_class is ErrorClass.HANDOFF_PATH
    assert what in refused.value.message


@pytest.mark.parametrize(
    "row, says",
    [
        (["a", "socket", 0o644, 1, 0, None, None, None, 0], "type 'socket'"),
        (["a", "file", "644", 1, 0, None, None, None, 0], "mode is not an integer"),
        (["a", "file", 0o644, 1, 0, "ab", None, None, 0], "sha256 is not 64 hex digits"),
        (["a", "file", 0o644, 1, 0, "a" * 64, None, "../x", 0], "object is not"),
        (["a", "file", 0o644, 1, -1, None, None, None, 0], "out of range"),
        (["a", "file"], "a list of 9 values"),
    ],
)
def test_a_manifest_row_that_is_not_an_entry_is_refused(row: list[object], says: str) -> None:
    with pytest.raises(ValueError) as refused:
        ManifestEntry.from_row(row)
    assert says in str(refused.value)


def test_a_manifest_round_trips_as_rows() -> None:
    manifest = Manifest(
        job_id="job_" + "0" * 20,
        stage="build",
        attempt=2,
        patterns=("out",),
        entries=(
            ManifestEntry(path="out", type="dir", mode=0o755, mtime_ns=1),
            _file("out/app"),
            ManifestEntry(path="out/l", type="symlink", mode=0o777, mtime_ns=2, target="app"),
        ),
    )
    dumped = manifest.model_dump(mode="json")
    assert dumped["entries"][1] == ["out/app", "file", 0o644, 1, 1, SHA, None, "packs/" + SHA, 0]
    assert Manifest.model_validate(dumped) == manifest


def test_a_later_stage_wins_and_replaces_what_it_covers() -> None:
    build = Manifest(
        job_id="job_" + "0" * 20,
        stage="build",
        attempt=1,
        patterns=("out",),
        entries=(
            ManifestEntry(path="out", type="dir", mode=0o755, mtime_ns=1),
            _file("out/app"),
            _file("out/lib/a"),
            ManifestEntry(path="out/lib", type="dir", mode=0o755, mtime_ns=1),
        ),
    )
    sign = Manifest(
        job_id="job_" + "0" * 20,
        stage="sign",
        attempt=1,
        patterns=("out/lib", "out/app"),
        entries=(
            _file("out/lib"),  # a directory before, a file now: what was under it goes
            _file("out/app", mtime_ns=9),
        ),
    )
    tree = merge([(build, "b", "p/"), (sign, "b", "p/")])
    assert sorted(tree) == ["out", "out/app", "out/lib"]
    assert tree["out/app"].entry.mtime_ns == 9 and tree["out/lib"].entry.type == "file"


JOB = "job_" + "0" * 20


def _shard(
    k: int, *entries: ManifestEntry, stage: str = "test", job_id: str = JOB
) -> tuple[Source, Manifest]:
    summary = HandoffSummary(
        manifest=f"s3://b/p/.relevo-handoff/manifests/{stage}.shard-{k}.1.json",
        manifest_sha256=SHA,
        attempt=1,
        digest=SHA,
        stored_at="2026-12-03T00:00:00+00:00",
    )
    return Source(stage, job_id, summary, k), Manifest(
        job_id=job_id, stage=stage, attempt=1, patterns=("results",), entries=entries
    )


def _apart(*shards: tuple[Source, Manifest]) -> None:
    check_shards_apart([source for source, _ in shards], [manifest for _, manifest in shards])


def _dir(path: str, mtime_ns: int = 1) -> ManifestEntry:
    return ManifestEntry(path=path, type="dir", mode=0o755, mtime_ns=mtime_ns)


def test_shards_handing_on_paths_of_their_own_share_their_directories() -> None:
    # Given three shards that each put their own file in results/ (the directory's mtime differs)
    shards = [
        _shard(k, _dir("results", mtime_ns=k), _file(f"results/{k}.xml", sha256=str(k) * 64))
        for k in range(3)
    ]
    # and each hands on unchanged the bundle they were all restored
    shards += [_shard(3, _dir("results", mtime_ns=3), _file("build/App.app/App", mode=0o755))]
    shards += [_shard(4, _file("build/App.app/App", mode=0o755))]

    # Then they are apart, and the merge holds every shard's file once in one results/
    _apart(*shards)
    tree = merge([(manifest, "b", "p/") for _, manifest in shards])
    assert sorted(tree) == ["build/App.app/App", "results", "results/0.xml", "results/1.xml", "results/2.xml"]


@pytest.mark.parametrize(
    ("first", "second", "path", "how"),
    [
        (
            (_file("results/junit.xml"),),
            (_file("results/junit.xml", sha256="b" * 64),),
            "results/junit.xml",
            "differently",
        ),
        (
            (_file("results/junit.xml"),),
            (_file("results/junit.xml", mode=0o600),),
            "results/junit.xml",
            "differently",
        ),
        (
            (_file("results/junit.xml"),),
            (_file("results/junit.xml", mtime_ns=7),),
            "results/junit.xml",
            "differently",
        ),
        ((_file("out"),), (_dir("out"),), "out", "as a file and as a dir"),
        ((_file("out"),), (_dir("out"), _file("out/x")), "out", "as a file and as a dir"),
        ((_file("out"),), (_file("out/x"),), "out", "as a file and as a directory holding out/x"),
        (
            (ManifestEntry(path="l", type="symlink", mode=0o777, mtime_ns=1, target="a"),),
            (ManifestEntry(path="l", type="symlink", mode=0o777, mtime_ns=1, target="b"),),
            "l",
            "differently",
        ),
    ],
    ids=[
        "bytes",
        "mode",
        "mtime",
        "file and dir",
        "file and dir with content",
        "file above a file",
        "link targets",
    ],
)
def test_two_shards_handing_on_one_path_differently_are_refused_naming_both(
    first, second, path: str, how: str
) -> None:
    with pytest.raises(HandoffFailure) as refused:
        _apart(_shard(0, _file("results/0.xml")), _shard(2, *first), _shard(1, *second))

    assert refused.value.error_class is ErrorClass.HANDOFF_CONFLICT
    assert (
        f"shards test#shard-1 and test#shard-2 of {JOB} both hand on {path!r} ({how}" in refused.value.message
    )


def test_shards_of_different_stages_or_jobs_are_not_compared_a_later_stage_wins_as_ever() -> None:
    _apart(
        _shard(0, _file("out")),
        _shard(1, _file("out", sha256="b" * 64), stage="lint"),
        _shard(1, _file("out", sha256="c" * 64), job_id="job_" + "1" * 20),
    )


def test_only_files_dirs_and_links_can_be_handed_on(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(tmp_path / "out" / "sock"))
        with pytest.raises(HandoffFailure) as refused:
            scan(tmp_path, ("out",))
        assert refused.value.error_class is ErrorClass.HANDOFF_PATH and "out/sock" in refused.value.message
    finally:
        listener.close()


def test_a_glob_never_hands_on_the_checkouts_repository(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n")
    (tmp_path / "app.ipa").write_text("ipa")
    assert [entry.path for entry in scan(tmp_path, ("*",))] == ["app.ipa"]


def test_the_handoff_keys_are_spelled_in_one_place_and_read_back_from_a_manifests_location() -> None:
    from relevo_core.models.handoff import (
        base_of_manifest,
        blob_object,
        handoff_base,
        manifest_key,
        pack_object,
    )

    # Given a job's artifact_uri and an attempt of a shard that hands files on
    uri = "s3://artifacts/project-1/job_x/"
    sha = "a" * 64

    # When its objects and manifest are named
    bucket, manifest = manifest_key(uri, "test", 2, 3)

    # Then the objects are what a manifest entry may name, and the manifest's own location gives
    # back the prefix they are under
    assert (pack_object(sha), blob_object(sha)) == (f"packs/{sha}", f"blobs/{sha}")
    for name in (pack_object(sha), blob_object(sha)):
        assert ManifestEntry("f", "file", 0o644, 0, 1, sha, None, name, 0).problem() is None
    assert base_of_manifest(f"s3://{bucket}/{manifest}") == handoff_base(uri)
    assert manifest == "project-1/job_x/.relevo-handoff/manifests/test.shard-2.3.json"
