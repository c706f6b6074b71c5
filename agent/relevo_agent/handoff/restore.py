"""Before a stage's command: every earlier stage's handoff, back at the same paths of this
workspace, exactly as it was stored (relevo_agent.handoff.store).

Sources come in plan order, each a succeeded stage's receipt (its manifest's URI and sha256); a
later stage's path wins over an earlier one's. Each manifest is read and its sha256 compared with
the receipt's before anything of it is used, then each path is checked again (a crafted manifest
cannot write outside the workspace: no absolute path, no '..', nothing under .git, no link out of
it, never a write through a symlink). Then, per file:

- already here with the same bytes (hashed): kept, its mode and mtime set;
- in this Mac's handoff cache: copied from it, hashed as it is copied;
- else fetched (a pack's range, a blob in parallel parts), hashed as it is written.

Nothing is written in place: each file goes to a temporary name in its directory and is renamed
over the path once its bytes are verified, with its mode and mtime, and the workspace's owner
(with `run_as` the build user's; directories and links are handed over before the command, by
relevo_agent.build_user). A byte that does not match fails the stage with Relevo.Fatal.Checksum
(never retried), a stored object that is gone with Relevo.Fatal.HandoffGone. A handed-on
directory is restored exactly: what else is in it (an earlier job's leftover) is removed.
Directories get their modes and mtimes last, deepest first. Extended attributes are not carried
(docs/handoff.md says why).

The manifests are relevo_agent.handoff.manifests'; how a path is put in place, relevo_agent.handoff.place's;
the fetch, relevo_agent.handoff.fetch's. `Source` and `Stopped` are named here too, for the callers.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from relevo_agent.handoff import HandoffFailure, Stopped
from relevo_agent.handoff.cache import HandoffCache
from relevo_agent.handoff.fetch import fetch_files
from relevo_agent.handoff.manifests import (
    Placed,
    Source,
    check_entries,
    check_shards_apart,
    fail_checksum,
    merge,
    read_manifest,
)
from relevo_agent.handoff.place import Writer, ensure_directory, place_link, remove_path
from relevo_agent.handoff.store import PARALLEL_OBJECTS, Location
from relevo_agent.handoff.tree import real_parents, sha256_file
from relevo_core.aws import in_this_context
from relevo_core.models.errors import ErrorClass
from relevo_core.models.handoff import ManifestEntry, tree_digest
from relevo_core.models.transfer import human_bytes

log = logging.getLogger(__name__)

__all__ = ["RestoreResult", "Source", "Stopped", "restore_handoffs"]


@dataclass
class RestoreResult:
    files: int = 0
    bytes: int = 0
    restored_bytes: int = 0
    cached_bytes: int = 0
    present_bytes: int = 0
    digest: str = ""
    from_stages: tuple[str, ...] = ()
    seconds: float = 0.0
    # sha256 -> where this job stored those bytes (for the stage's own store: referenced, not sent again)
    known: dict[str, Location] | None = None


def restore_handoffs(
    sources: list[Source],
    workspace: Path,
    cache: HandoffCache | None,
    emit: Callable[[str], None],
    cancel: threading.Event,
    this_job: str,
) -> RestoreResult:
    """Restore every source into `workspace` (already the job's checkout, if it has one)."""
    started = time.monotonic()
    workspace.mkdir(parents=True, exist_ok=True)
    known: dict[str, Location] = {}
    result = RestoreResult(from_stages=tuple(source.label for source in sources), known=known)
    if not sources:
        result.digest = tree_digest([])
        return result
    manifests = []
    for source in sources:
        manifest, bucket, prefix = read_manifest(source)
        check_entries(source.label, manifest.entries)
        manifests.append((manifest, bucket, prefix))
        if source.job_id == this_job:
            for entry in manifest.files:
                assert entry.sha256 is not None and entry.object is not None
                known[entry.sha256] = Location(entry.object, entry.offset)
    check_shards_apart(sources, [manifest for manifest, _, _ in manifests])
    place_tree(merge(manifests), workspace, cache, emit, cancel, result)
    result.seconds = round(time.monotonic() - started, 3)
    emit(
        f"[relevo] handoff: restored {result.files} file(s), {human_bytes(result.bytes)} from "
        f"{', '.join(result.from_stages)} "
        f"in {result.seconds:.1f}s: {human_bytes(result.restored_bytes)} downloaded, "
        f"{human_bytes(result.cached_bytes)} from this "
        f"Mac's cache, {human_bytes(result.present_bytes)} already here; tree digest {result.digest}"
    )
    return result


def place_tree(
    tree: dict[str, Placed],
    workspace: Path,
    cache: HandoffCache | None,
    emit: Callable[[str], None],
    cancel: threading.Event,
    result: RestoreResult,
) -> None:
    """`tree` (merged manifests) put in `workspace`, verified; counts and digest into `result`.
    Also what a cache's restore puts in its staging directory (relevo_agent.caches)."""
    placed = [tree[path] for path in sorted(tree)]
    files = [p for p in placed if p.entry.type == "file"]
    result.files, result.bytes = len(files), sum(p.entry.size for p in files)
    # Directories first (exact: what else is in a handed-on directory goes), then links.
    for item in placed:
        entry = item.entry
        if entry.type == "dir":
            ensure_directory(workspace, entry.path)
            wanted = {path.rsplit("/", 1)[1] for path in tree if path.rpartition("/")[0] == entry.path}
            with os.scandir(workspace / entry.path) as children:
                extra = [child.name for child in children if child.name not in wanted]
            for name in extra:
                remove_path(workspace / entry.path / name)
    files_here: list[Placed] = []
    for item in placed:
        entry = item.entry
        if entry.type == "dir":
            continue
        ensure_directory(workspace, entry.path.rpartition("/")[0])
        if (
            real_parents(workspace, entry.path) is not None
        ):  # cannot happen after ensure_directory; never write through one
            raise HandoffFailure(
                ErrorClass.HANDOFF_PATH, f"handoff: {entry.path} lies under a symlink of the workspace"
            )
        if entry.type == "symlink":
            place_link(workspace, entry)
        else:
            files_here.append(item)

    def local(item: Placed) -> str:
        """Where a file's bytes came from without the network: "present", "cache", or "" (fetch it)."""
        entry = item.entry
        if cancel.is_set():
            raise Stopped()
        if _present(workspace, entry):
            os.chmod(workspace / entry.path, entry.mode)
            os.utime(workspace / entry.path, ns=(entry.mtime_ns, entry.mtime_ns))
            return "present"
        if cache is not None and _from_cache(workspace, entry, cache):
            return "cache"
        return ""

    # Side by side (hashing and file system calls let go of the GIL), in path order of results.
    with ThreadPoolExecutor(max_workers=PARALLEL_OBJECTS, thread_name_prefix="handoff-local") as pool:
        found_in = list(pool.map(in_this_context(local), files_here))
    missing: list[Placed] = []
    for item, where in zip(files_here, found_in, strict=True):
        if where == "present":
            result.present_bytes += item.entry.size
        elif where == "cache":
            result.cached_bytes += item.entry.size
        else:
            missing.append(item)
    if missing:
        result.restored_bytes = fetch_files(workspace, missing, cache, emit, cancel)
    # Directories' own modes and mtimes last, deepest first (writing children changed them).
    for item in reversed(placed):
        entry = item.entry
        if entry.type == "dir":
            os.chmod(workspace / entry.path, entry.mode)
            os.utime(workspace / entry.path, ns=(entry.mtime_ns, entry.mtime_ns))
    _confirm(workspace, placed)
    result.digest = tree_digest([item.entry for item in placed])


def _present(workspace: Path, entry: ManifestEntry) -> bool:
    path = workspace / entry.path
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size == entry.size and sha256_file(path) == entry.sha256


def _from_cache(workspace: Path, entry: ManifestEntry, cache: HandoffCache) -> bool:
    assert entry.sha256 is not None
    if not cache.has(entry.sha256):
        return False
    writer = Writer(workspace, entry)
    try:
        if not cache.copy_out(entry.sha256, writer.fd):  # hashed as it was copied
            writer.abandon()
            return False
        writer.finish("this Mac's handoff cache", verified=True)
    except BaseException:
        writer.abandon()
        raise
    return True


def _confirm(workspace: Path, placed: list[Placed]) -> None:
    """What is on disk now is what the manifests say: type, mode and mtime of every path (each
    file's bytes were verified as they were written)."""
    for item in placed:
        entry = item.entry
        info = os.lstat(workspace / entry.path)
        kind = (
            "dir"
            if stat.S_ISDIR(info.st_mode)
            else "symlink"
            if stat.S_ISLNK(info.st_mode)
            else "file"
            if stat.S_ISREG(info.st_mode)
            else "other"
        )
        mode_differs = entry.type != "symlink" and stat.S_IMODE(info.st_mode) != entry.mode
        time_differs = (
            entry.type != "symlink" or os.utime in os.supports_follow_symlinks
        ) and info.st_mtime_ns != entry.mtime_ns
        if kind != entry.type or mode_differs or time_differs:
            raise fail_checksum(
                f"{entry.path} is a {kind} with mode {stat.S_IMODE(info.st_mode):o} and mtime "
                f"{info.st_mtime_ns} after the restore; "
                f"the manifest says a {entry.type} with mode {entry.mode:o} and mtime {entry.mtime_ns}"
            )
