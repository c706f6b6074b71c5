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
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import stat
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from botocore.exceptions import ClientError
from pydantic import ValidationError

from relevo_agent.artifacts import classify_storage_error
from relevo_agent.handoff import HandoffFailure
from relevo_agent.handoff.cache import HandoffCache
from relevo_agent.handoff.store import PARALLEL_OBJECTS, Location, _Progress, base_of_manifest
from relevo_agent.handoff.tree import READ_BLOCK, real_parents, sha256_file
from relevo_core.aws import client, error_code, in_this_context
from relevo_core.models.errors import ErrorClass
from relevo_core.models.handoff import HandoffSummary, Manifest, ManifestEntry, link_target_problem, path_problem, tree_digest
from relevo_core.models.transfer import human_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """A succeeded stage whose handoff this stage restores (of this job, or of the job a rerun
    stands on for a stage it skipped)."""

    stage: str
    job_id: str
    summary: HandoffSummary


@dataclass(frozen=True)
class Placed:
    entry: ManifestEntry
    bucket: str
    prefix: str  # the handoff prefix of the job that stored it


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


class Stopped(Exception):
    """The stage was stopped (fenced, canceled, shut down) during the restore."""


def _fail_checksum(what: str) -> HandoffFailure:
    return HandoffFailure(ErrorClass.CHECKSUM, f"handoff: {what}")


def _read_manifest(source: Source) -> tuple[Manifest, str, str]:
    bucket, prefix = base_of_manifest(source.summary.manifest)
    key = source.summary.manifest.removeprefix(f"s3://{bucket}/")
    try:
        data = client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
            raise HandoffFailure(
                ErrorClass.HANDOFF_GONE,
                f"handoff: the manifest of stage {source.stage} of {source.job_id} ({source.summary.manifest}) is no longer "
                "stored (expired, or removed by artifact.max_total_bytes)",
            ) from exc
        raise HandoffFailure(classify_storage_error(exc), f"handoff: reading {source.summary.manifest}: {exc}") from exc
    except Exception as exc:
        raise HandoffFailure(classify_storage_error(exc), f"handoff: reading {source.summary.manifest}: {exc}") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != source.summary.manifest_sha256:
        raise _fail_checksum(
            f"the manifest of stage {source.stage} ({source.summary.manifest}) has sha256 {actual}, its receipt says "
            f"{source.summary.manifest_sha256}: it was altered in storage; nothing of it is used"
        )
    try:
        manifest = Manifest.model_validate(json.loads(data))
    except (ValueError, ValidationError) as exc:
        raise HandoffFailure(ErrorClass.HANDOFF_PATH, f"handoff: the manifest of stage {source.stage} cannot be read: {exc}") from exc
    return manifest, bucket, prefix


def check_entries(stage: str, entries: tuple[ManifestEntry, ...]) -> None:
    """A manifest's paths, as a crafted one might hold them: anything that could write outside
    the workspace (or into .git) is refused before anything is written."""
    by_path: dict[str, ManifestEntry] = {}
    for entry in entries:
        problem = path_problem(entry.path)
        if problem:
            raise HandoffFailure(ErrorClass.HANDOFF_PATH, f"handoff: stage {stage}'s manifest names {entry.path!r}, which {problem}")
        if entry.path in by_path:
            raise HandoffFailure(ErrorClass.HANDOFF_PATH, f"handoff: stage {stage}'s manifest names {entry.path!r} twice")
        by_path[entry.path] = entry
        if entry.type == "symlink":
            problem = link_target_problem(entry.path, entry.target or "")
            if problem:
                raise HandoffFailure(ErrorClass.HANDOFF_PATH, f"handoff: stage {stage}'s manifest has {entry.path!r}, a symlink that {problem}")
        elif entry.type == "file" and (entry.sha256 is None or entry.object is None):
            raise HandoffFailure(ErrorClass.HANDOFF_PATH, f"handoff: stage {stage}'s manifest has the file {entry.path!r} without its sha256 or object")
    for entry in entries:
        parent = entry.path.rpartition("/")[0]
        while parent:
            above = by_path.get(parent)
            if above is not None and above.type != "dir":
                raise HandoffFailure(
                    ErrorClass.HANDOFF_PATH, f"handoff: stage {stage}'s manifest puts {entry.path!r} under {parent!r}, a {above.type}"
                )
            parent = parent.rpartition("/")[0]


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


def _ensure_directory(workspace: Path, relative: str) -> None:
    """`relative` a real directory of the workspace, its parents too; whatever else stands at one
    of those paths (a leftover file, a symlink) is replaced, never followed."""
    current = workspace
    for part in relative.split("/") if relative else []:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            os.mkdir(current)  # as mkdir -p would (the umask's mode); a handed-on one gets its own last
            continue
        if stat.S_ISDIR(info.st_mode):
            if info.st_mode & 0o700 != 0o700:  # a handed-on directory's own mode comes last; writing into it first
                os.chmod(current, stat.S_IMODE(info.st_mode) | 0o700)
            continue
        os.unlink(current)
        os.mkdir(current)


def _remove(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


_TEMPORARY = itertools.count()


class _Writer:
    """A file's bytes into a temporary name beside it, hashed as they are written."""

    def __init__(self, workspace: Path, entry: ManifestEntry) -> None:
        self.entry = entry
        self.final = workspace / entry.path
        # A name of this process's own (its pid and a counter): no two writers share one.
        self.temporary = self.final.with_name(f".{self.final.name}.relevo-{os.getpid()}-{next(_TEMPORARY)}")
        self.fd = os.open(self.temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        _owned_like(self.fd, workspace)
        self.digest = hashlib.sha256()
        self.written = 0

    def write(self, data: bytes | memoryview) -> None:
        self.digest.update(data)
        view = memoryview(data)
        while view:
            count = os.write(self.fd, view)
            view = view[count:]
        self.written += len(data)

    def abandon(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
        try:
            os.unlink(self.temporary)
        except FileNotFoundError:
            pass

    def finish(self, what: str, verified: bool = False) -> None:
        """Verified (`verified`: the bytes were hashed as they were copied in), then renamed over
        the path with the entry's mode and mtime."""
        try:
            if verified:
                self.written = os.fstat(self.fd).st_size
                actual = self.entry.sha256
            else:
                actual = self.digest.hexdigest()
            if actual != self.entry.sha256 or self.written != self.entry.size:
                raise _fail_checksum(
                    f"{self.entry.path} from {what}: {self.written} bytes with sha256 {actual}, the manifest says "
                    f"{self.entry.size} bytes with {self.entry.sha256}; not restored"
                )
            os.fchmod(self.fd, self.entry.mode)
            os.close(self.fd)
            self.fd = -1
            os.utime(self.temporary, ns=(self.entry.mtime_ns, self.entry.mtime_ns))
            _replace(self.temporary, self.final)
        except BaseException:
            if self.fd >= 0:
                self.abandon()
            else:
                try:
                    os.unlink(self.temporary)
                except FileNotFoundError:
                    pass
            raise


def _owned_like(fd: int, workspace: Path) -> None:
    """A restored file is the workspace owner's: with `run_as`, the build user's (relevo_agent.
    build_user). Given before its mode is set (a chown clears set-user-ID bits) and before the
    cache links it (the agent never hands over a file with more than one link)."""
    owner = os.stat(workspace)
    if owner.st_uid != os.geteuid():
        os.fchown(fd, owner.st_uid, owner.st_gid)


def _replace(temporary: Path, final: Path) -> None:
    try:
        info = os.lstat(final)
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(final)
    except FileNotFoundError:
        pass
    os.replace(temporary, final)


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
    result = RestoreResult(from_stages=tuple(source.stage for source in sources), known={})
    if not sources:
        result.digest = tree_digest([])
        return result
    manifests = []
    for source in sources:
        manifest, bucket, prefix = _read_manifest(source)
        check_entries(source.stage, manifest.entries)
        manifests.append((manifest, bucket, prefix))
        if source.job_id == this_job:
            for entry in manifest.files:
                assert entry.sha256 is not None and entry.object is not None
                result.known[entry.sha256] = Location(entry.object, entry.offset)  # type: ignore[index]
    tree = merge(manifests)
    placed = [tree[path] for path in sorted(tree)]
    files = [p for p in placed if p.entry.type == "file"]
    result.files, result.bytes = len(files), sum(p.entry.size for p in files)
    # Directories first (exact: what else is in a handed-on directory goes), then links.
    for item in placed:
        entry = item.entry
        if entry.type == "dir":
            _ensure_directory(workspace, entry.path)
            wanted = {path.rsplit("/", 1)[1] for path in tree if path.rpartition("/")[0] == entry.path}
            with os.scandir(workspace / entry.path) as children:
                extra = [child.name for child in children if child.name not in wanted]
            for name in extra:
                _remove(workspace / entry.path / name)
    files_here: list[Placed] = []
    for item in placed:
        entry = item.entry
        if entry.type == "dir":
            continue
        _ensure_directory(workspace, entry.path.rpartition("/")[0])
        if real_parents(workspace, entry.path) is not None:  # cannot happen after _ensure_directory; never write through one
            raise HandoffFailure(ErrorClass.HANDOFF_PATH, f"handoff: {entry.path} lies under a symlink of the workspace")
        if entry.type == "symlink":
            _place_link(workspace, entry)
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
        sources = list(pool.map(in_this_context(local), files_here))
    fetch: list[Placed] = []
    for item, source in zip(files_here, sources):
        if source == "present":
            result.present_bytes += item.entry.size
        elif source == "cache":
            result.cached_bytes += item.entry.size
        else:
            fetch.append(item)
    if fetch:
        result.restored_bytes = _fetch(workspace, fetch, cache, emit, cancel)
    # Directories' own modes and mtimes last, deepest first (writing children changed them).
    for item in reversed(placed):
        entry = item.entry
        if entry.type == "dir":
            os.chmod(workspace / entry.path, entry.mode)
            os.utime(workspace / entry.path, ns=(entry.mtime_ns, entry.mtime_ns))
    _confirm(workspace, placed)
    result.digest = tree_digest([item.entry for item in placed])
    result.seconds = round(time.monotonic() - started, 3)
    emit(
        f"[relevo] handoff: restored {result.files} file(s), {human_bytes(result.bytes)} from {', '.join(result.from_stages)} "
        f"in {result.seconds:.1f}s: {human_bytes(result.restored_bytes)} downloaded, {human_bytes(result.cached_bytes)} from this "
        f"Mac's cache, {human_bytes(result.present_bytes)} already here; tree digest {result.digest}"
    )
    return result


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
    writer = _Writer(workspace, entry)
    try:
        if not cache.copy_out(entry.sha256, writer.fd):  # hashed as it was copied
            writer.abandon()
            return False
        writer.finish("this Mac's handoff cache", verified=True)
    except BaseException:
        writer.abandon()
        raise
    return True


def _place_link(workspace: Path, entry: ManifestEntry) -> None:
    final = workspace / entry.path
    try:
        if os.path.islink(final) and os.readlink(final) == entry.target:
            _link_time(final, entry)
            return
    except OSError:
        pass
    temporary = final.with_name(f".{final.name}.relevo-{os.getpid()}-{next(_TEMPORARY)}")
    os.symlink(entry.target or "", temporary)
    _link_time(temporary, entry)
    _replace(temporary, final)


def _link_time(path: Path, entry: ManifestEntry) -> None:
    if os.utime in os.supports_follow_symlinks:
        os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)


def _fetch(workspace: Path, items: list[Placed], cache: HandoffCache | None, emit: Callable[[str], None], cancel: threading.Event) -> int:
    """Download and verify `items`, PARALLEL_OBJECTS objects at a time; returns the bytes downloaded."""
    by_object: dict[tuple[str, str, str], list[Placed]] = {}
    for item in items:
        assert item.entry.object is not None
        by_object.setdefault((item.bucket, item.prefix, item.entry.object), []).append(item)
    total = sum(item.entry.size for item in items)
    progress = _Progress(emit, "restored", total)
    downloaded = [0]
    lock = threading.Lock()
    s3 = client("s3")
    emit(f"[relevo] handoff: downloading {len(items)} file(s), {human_bytes(total)}, from {len(by_object)} object(s)")

    def count(amount: int) -> None:
        with lock:
            downloaded[0] += amount
        progress.add(amount)

    def one(key: tuple[str, str, str], members: list[Placed]) -> None:
        if cancel.is_set():
            raise Stopped()
        bucket, prefix, name = key
        uri = f"s3://{bucket}/{prefix}{name}"
        try:
            if name.startswith("blobs/"):
                _blob(s3, bucket, prefix + name, uri, workspace, members, cache, count)
            else:
                _pack(s3, bucket, prefix + name, uri, workspace, members, cache, count, cancel)
        except (HandoffFailure, Stopped):
            raise
        except ClientError as exc:
            if error_code(exc) in ("NoSuchKey", "404", "NotFound", "InvalidRange"):
                raise HandoffFailure(
                    ErrorClass.HANDOFF_GONE, f"handoff: {uri} is no longer stored (expired, or removed by artifact.max_total_bytes)"
                ) from exc
            raise HandoffFailure(classify_storage_error(exc), f"handoff: fetching {uri}: {exc}") from exc
        except Exception as exc:
            raise HandoffFailure(classify_storage_error(exc), f"handoff: fetching {uri}: {exc}") from exc

    with ThreadPoolExecutor(max_workers=PARALLEL_OBJECTS, thread_name_prefix="handoff-get") as pool:
        futures = [pool.submit(in_this_context(one), key, members) for key, members in by_object.items()]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((future.exception() for future in done if future.exception() is not None), None)
        if failed is not None:
            for future in futures:
                future.cancel()
            raise failed
    return downloaded[0]


def _same_bytes(members: list[Placed]) -> dict[str, list[Placed]]:
    by_sha: dict[str, list[Placed]] = {}
    for member in members:
        by_sha.setdefault(member.entry.sha256 or "", []).append(member)
    return by_sha


def _copies(workspace: Path, first: Placed, others: list[Placed]) -> None:
    """Paths with the same bytes as `first` (just verified): copied from it, verified again."""
    for other in others:
        writer = _Writer(workspace, other.entry)
        try:
            with open(workspace / first.entry.path, "rb") as handle:
                for block in iter(lambda: handle.read(READ_BLOCK), b""):
                    writer.write(block)
            writer.finish(first.entry.path)
        except BaseException:
            writer.abandon()
            raise


def _pack(s3, bucket: str, key: str, uri: str, workspace: Path, members: list[Placed], cache: HandoffCache | None,  # type: ignore[no-untyped-def]
          count: Callable[[int], None], cancel: threading.Event) -> None:
    groups = _same_bytes(members)
    firsts = sorted((group[0] for group in groups.values()), key=lambda m: m.entry.offset)
    start = firsts[0].entry.offset
    end = max(m.entry.offset + m.entry.size for m in firsts)
    if end == start:  # only empty files
        for first in firsts:
            writer = _Writer(workspace, first.entry)
            writer.finish(uri)
            _copies(workspace, first, groups[first.entry.sha256 or ""][1:])
        return
    stream = _Stream(s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"], count)
    position = start
    for first in firsts:
        if cancel.is_set():
            raise Stopped()
        entry = first.entry
        while position < entry.offset:  # bytes of files not needed here (already present)
            skipped = stream.read(entry.offset - position)
            if not skipped:
                break
            position += len(skipped)
        writer = _Writer(workspace, entry)
        try:
            left = entry.size
            while left:
                piece = stream.read(left)
                if not piece:
                    break
                writer.write(piece)
                left -= len(piece)
            position += entry.size - left
            writer.finish(uri)
        except BaseException:
            writer.abandon()
            raise
        if cache is not None:
            cache.keep(workspace / entry.path, entry.sha256 or "")
        _copies(workspace, first, groups[entry.sha256 or ""][1:])


class _Stream:
    """A response body read block by block, handed out in pieces without copying."""

    def __init__(self, body, count: Callable[[int], None]) -> None:  # type: ignore[no-untyped-def]
        self.body, self.count = body, count
        self.block = memoryview(b"")
        self.at = 0

    def read(self, most: int) -> memoryview:
        if self.at >= len(self.block):
            data = self.body.read(READ_BLOCK)
            self.count(len(data))
            self.block, self.at = memoryview(data), 0
            if not data:
                return self.block
        piece = self.block[self.at : self.at + most]
        self.at += len(piece)
        return piece


def _blob(s3, bucket: str, key: str, uri: str, workspace: Path, members: list[Placed], cache: HandoffCache | None,  # type: ignore[no-untyped-def]
          count: Callable[[int], None]) -> None:
    """A large file in one stream, hashed as it is written (no second read). Objects are fetched
    PARALLEL_OBJECTS at a time, so a tree's few large files still come side by side."""
    first = members[0]
    writer = _Writer(workspace, first.entry)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        for block in iter(lambda: body.read(READ_BLOCK), b""):
            count(len(block))
            writer.write(block)
        writer.finish(uri)
    except BaseException:
        writer.abandon()
        raise
    if cache is not None:
        cache.keep(workspace / first.entry.path, first.entry.sha256 or "")
    _copies(workspace, first, members[1:])


def _confirm(workspace: Path, placed: list[Placed]) -> None:
    """What is on disk now is what the manifests say: type, mode and mtime of every path (each
    file's bytes were verified as they were written)."""
    for item in placed:
        entry = item.entry
        info = os.lstat(workspace / entry.path)
        kind = "dir" if stat.S_ISDIR(info.st_mode) else "symlink" if stat.S_ISLNK(info.st_mode) else "file" if stat.S_ISREG(info.st_mode) else "other"
        mode_differs = entry.type != "symlink" and stat.S_IMODE(info.st_mode) != entry.mode
        time_differs = (entry.type != "symlink" or os.utime in os.supports_follow_symlinks) and info.st_mtime_ns != entry.mtime_ns
        if kind != entry.type or mode_differs or time_differs:
            raise _fail_checksum(
                f"{entry.path} is a {kind} with mode {stat.S_IMODE(info.st_mode):o} and mtime {info.st_mtime_ns} after the restore; "
                f"the manifest says a {entry.type} with mode {entry.mode:o} and mtime {entry.mtime_ns}"
            )
