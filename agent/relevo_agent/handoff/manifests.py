"""The manifests a stage restores from (relevo_agent.handoff.store wrote them): each read and its
sha256 compared with the receipt's before anything of it is used, its paths checked (a crafted
manifest cannot write outside the workspace: no absolute path, no '..', nothing under .git, no
link out of it), and all of them merged into one tree, a later stage's path winning.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from botocore.exceptions import ClientError
from pydantic import ValidationError

from relevo_agent.artifacts import classify_storage_error
from relevo_agent.handoff import HandoffFailure
from relevo_core.aws import client, error_code
from relevo_core.models.errors import ErrorClass
from relevo_core.models.handoff import (
    HandoffSummary,
    Manifest,
    ManifestEntry,
    base_of_manifest,
    link_target_problem,
    path_problem,
)


@dataclass(frozen=True)
class Source:
    """A succeeded stage whose handoff this stage restores (of this job, or of the job a rerun
    stands on for a stage it skipped)."""

    stage: str
    job_id: str
    summary: HandoffSummary
    # The shard of a stage with shards: each shard's manifest is a source of its own.
    shard: int | None = None

    @property
    def label(self) -> str:
        return self.stage if self.shard is None else f"{self.stage}#shard-{self.shard}"


@dataclass(frozen=True)
class Placed:
    entry: ManifestEntry
    bucket: str
    prefix: str  # the handoff prefix of the job that stored it


def fail_checksum(what: str) -> HandoffFailure:
    return HandoffFailure(ErrorClass.CHECKSUM, f"handoff: {what}")


def read_manifest(source: Source) -> tuple[Manifest, str, str]:
    bucket, prefix = base_of_manifest(source.summary.manifest)
    key = source.summary.manifest.removeprefix(f"s3://{bucket}/")
    try:
        data = client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
            raise HandoffFailure(
                ErrorClass.HANDOFF_GONE,
                f"handoff: the manifest of stage {source.label} of {source.job_id} "
                f"({source.summary.manifest}) is no longer "
                "stored (expired, or removed by artifact.max_total_bytes)",
            ) from exc
        raise HandoffFailure(
            classify_storage_error(exc), f"handoff: reading {source.summary.manifest}: {exc}"
        ) from exc
    except Exception as exc:
        raise HandoffFailure(
            classify_storage_error(exc), f"handoff: reading {source.summary.manifest}: {exc}"
        ) from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != source.summary.manifest_sha256:
        raise fail_checksum(
            f"the manifest of stage {source.label} ({source.summary.manifest}) has sha256 {actual}, its "
            "receipt says "
            f"{source.summary.manifest_sha256}: it was altered in storage; nothing of it is used"
        )
    try:
        manifest = Manifest.model_validate(json.loads(data))
    except (ValueError, ValidationError) as exc:
        raise HandoffFailure(
            ErrorClass.HANDOFF_PATH, f"handoff: the manifest of stage {source.label} cannot be read: {exc}"
        ) from exc
    return manifest, bucket, prefix


def check_entries(stage: str, entries: tuple[ManifestEntry, ...], links_out: bool = False) -> None:
    """A manifest's paths, as a crafted one might hold them: anything that could write outside
    the workspace (or into .git) is refused before anything is written. With `links_out` (a
    cache's), a symlink may point outside: it is placed as a link and nothing is written through it."""
    by_path: dict[str, ManifestEntry] = {}
    for entry in entries:
        problem = path_problem(entry.path)
        if problem:
            raise HandoffFailure(
                ErrorClass.HANDOFF_PATH,
                f"handoff: stage {stage}'s manifest names {entry.path!r}, which {problem}",
            )
        if entry.path in by_path:
            raise HandoffFailure(
                ErrorClass.HANDOFF_PATH, f"handoff: stage {stage}'s manifest names {entry.path!r} twice"
            )
        by_path[entry.path] = entry
        if entry.type == "symlink":
            problem = (
                link_target_problem(entry.path, entry.target or "")
                if not links_out
                else ("has an empty target" if not entry.target or "\0" in entry.target else None)
            )
            if problem:
                raise HandoffFailure(
                    ErrorClass.HANDOFF_PATH,
                    f"handoff: stage {stage}'s manifest has {entry.path!r}, a symlink that {problem}",
                )
        elif entry.type == "file" and (entry.sha256 is None or entry.object is None):
            raise HandoffFailure(
                ErrorClass.HANDOFF_PATH,
                f"handoff: stage {stage}'s manifest has the file {entry.path!r} without its sha256 or object",
            )
    for entry in entries:
        parent = entry.path.rpartition("/")[0]
        while parent:
            above = by_path.get(parent)
            if above is not None and above.type != "dir":
                raise HandoffFailure(
                    ErrorClass.HANDOFF_PATH,
                    f"handoff: stage {stage}'s manifest puts {entry.path!r} under {parent!r}, a {above.type}",
                )
            parent = parent.rpartition("/")[0]


def _same(one: ManifestEntry, other: ManifestEntry) -> bool:
    """The same file or link: type, bytes or target, mode and mtime (where it is stored aside)."""
    return (one.type, one.sha256, one.target, one.mode, one.mtime_ns) == (
        other.type,
        other.sha256,
        other.target,
        other.mode,
        other.mtime_ns,
    )


def check_shards_apart(sources: list[Source], manifests: list[Manifest]) -> None:
    """The shards of one stage hand on paths of their own: a file or link two shards hand on
    differently, or a path one shard has as a file and another as a directory (or under it),
    fails the stage with Relevo.Fatal.HandoffConflict naming both shards and the path. Shared
    directories are one directory holding what each put in it; the same file handed on
    unchanged by several (what they were all restored from) is one file."""
    groups: dict[tuple[str, str], list[tuple[Source, Manifest]]] = {}
    for source, manifest in zip(sources, manifests, strict=True):
        if source.shard is not None:
            groups.setdefault((source.job_id, source.stage), []).append((source, manifest))
    for group in groups.values():
        seen: dict[str, tuple[Source, ManifestEntry]] = {}
        for source, manifest in group:
            for entry in manifest.entries:
                first = seen.get(entry.path)
                if first is None:
                    seen[entry.path] = (source, entry)
                elif not (first[1].type == entry.type == "dir" or _same(first[1], entry)):
                    what = (
                        "differently"
                        if first[1].type == entry.type
                        else f"as a {first[1].type} and as a {entry.type}"
                    )
                    raise _conflict(first[0], source, entry.path, what)
        for path, (source, _entry) in seen.items():
            for parent in _parents(path):
                above = seen.get(parent)
                if above is not None and above[1].type != "dir":
                    raise _conflict(
                        above[0], source, parent, f"as a {above[1].type} and as a directory holding {path}"
                    )


def _conflict(first: Source, second: Source, path: str, what: str) -> HandoffFailure:
    one, other = sorted((first, second), key=lambda source: source.shard or 0)
    return HandoffFailure(
        ErrorClass.HANDOFF_CONFLICT,
        f"handoff: shards {one.label} and {other.label} of {one.job_id} both hand on {path!r} ({what}): a "
        "later stage cannot have "
        "both; let each shard hand on paths of its own (e.g. under a directory named by $RELEVO_SHARD_INDEX)",
    )


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:end]) for end in range(1, len(parts))]


def merge(manifests: list[tuple[Manifest, str, str]]) -> dict[str, Placed]:
    """One tree of every manifest, later stages winning: a later path that is not a directory
    drops what an earlier one had under it, and a later path under an earlier non-directory
    drops that one."""
    tree: dict[str, Placed] = {}
    # How many paths of the tree lie under each directory path: what a later non-directory replaces.
    below: dict[str, int] = {}

    def drop(path: str) -> None:
        del tree[path]
        for parent in _parents(path):
            below[parent] -= 1

    for manifest, bucket, prefix in manifests:
        for entry in manifest.entries:
            if entry.type != "dir" and below.get(entry.path):
                for path in [p for p in tree if p.startswith(entry.path + "/")]:
                    drop(path)
            for parent in _parents(entry.path):
                if parent in tree and tree[parent].entry.type != "dir":
                    drop(parent)
            if entry.path not in tree:
                for parent in _parents(entry.path):
                    below[parent] = below.get(parent, 0) + 1
            tree[entry.path] = Placed(entry, bucket, prefix)
    return tree
