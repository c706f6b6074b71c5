"""A stage's caches (relevo_core.models.cache, docs/caches.md): restored before its command, saved
after it, with the handoff's machinery (relevo_agent.handoff) under the project's cache prefix.

Restore: the key is rendered (the Mac's facts, the workspace, files' hashes); its entry, or else
the newest entry of the first restore key that has one, is read (the manifest's sha256 checked
against its record), put in a staging directory beside its root, every byte verified (this
Mac's content cache first: a warm Mac downloads nothing), its tree digest compared with the
manifest's, and only then moved into place, each declared path whole. Anything wrong with an
entry (gone, altered, a blob missing, a path that would escape) is a miss, logged: a cache never
fails a stage and never leaves a half-restored tree.

Save: after a successful command (or any, with `save: always`), when the key had no entry and
the job's ref may write (the envelope's cache_write; the job session's IAM says the same). Only
bytes the project's cache does not hold yet are sent: what the restored entry held is referenced
(a new key that differs by a few files uploads those files), a blob already stored under the
prefix is not sent again. The entry's manifest is put with `IfNoneMatch: "*"` (S3's conditional
write: 412 PreconditionFailed when the key exists, "Preventing object overwrites with conditional
writes", docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html), then recorded
with a conditional PutItem: of two jobs saving one key at once, one entry stays, whole.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from relevo_agent.build_user import BuildUser
from relevo_agent.handoff import HandoffFailure, Stopped
from relevo_agent.handoff.cache import HandoffCache
from relevo_agent.handoff.manifests import check_entries, merge
from relevo_agent.handoff.place import remove_path
from relevo_agent.handoff.restore import RestoreResult, place_tree
from relevo_agent.handoff.store import HandoffUpload, Location
from relevo_agent.handoff.tree import matches, real_parents, sha256_file
from relevo_core.aws import client, error_code
from relevo_core.models.cache import (
    MAX_KEY_CHARS,
    CacheEntry,
    CacheOutcome,
    CacheSpec,
    Root,
    cache_prefix,
    cache_scope,
    entry_object,
    render_key,
    short_sha256,
    split_cache_path,
)
from relevo_core.models.handoff import Manifest, normal_pattern, tree_digest
from relevo_core.models.transfer import human_bytes
from relevo_core.store import cache_entries
from relevo_core.store.stage_attempts import StageRef

log = logging.getLogger(__name__)

STAGING_DIR = ".relevo-cache-staging"
# A rendered {hash:...} whose pattern matched no file.
NO_FILES = "nofiles"


class CacheMiss(Exception):
    """Why an entry cannot be restored: the restore is a miss, logged with this."""


@dataclass
class CacheContext:
    """What a stage's caches are restored and saved with."""

    ref: StageRef
    stage: str
    bucket: str
    project: str
    region: str
    workspace: Path
    home: Path
    facts: dict[str, str | None]
    writable: bool
    content_cache: HandoffCache | None
    emit: Callable[[str], None]
    cancel: threading.Event
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    # This Mac, named on each entry it saves or restores (the claim route prefers it for the
    # cache's next stage: relevo_core.fleet.warm_macs).
    agent_id: str | None = None
    # With `run_as`, the build user: the home is its home, and what a restore puts in the home or
    # the workspace is its own (the command writes there).
    owner: BuildUser | None = None

    @property
    def scope(self) -> str:
        return cache_scope(self.project, self.region)

    @property
    def prefix(self) -> str:
        return cache_prefix(self.project, self.region)

    def root(self, name: Root) -> Path:
        return self.workspace if name == "workspace" else self.home


@dataclass
class CacheRun:
    """One cache through one attempt: its key, what its restore found, what its save did."""

    spec: CacheSpec
    key: str
    outcome: CacheOutcome
    # sha256 -> where the project's cache holds those bytes (of the entry restored).
    known: dict[str, Location] = field(default_factory=dict)


def files_hash(workspace: Path, pattern: str) -> str:
    """{hash:pattern}: the files it matches (a matched directory: every file under it), each path
    and sha256, hashed together; NO_FILES when it matches none."""
    lines = []
    for relative in matches(workspace, pattern):
        path = workspace / relative
        if path.is_dir() and not path.is_symlink():
            below = sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
            lines += [f"{p.relative_to(workspace).as_posix()}\0{sha256_file(p)}" for p in below]
        elif path.is_file():
            lines.append(f"{relative}\0{sha256_file(path)}")
    return short_sha256("\n".join(lines).encode()) if lines else NO_FILES


def keys_of(spec: CacheSpec, context: CacheContext) -> tuple[str, list[str]]:
    """(the key, the restore keys' prefixes), each `<cache name>/<rendered template>`."""
    facts = {**context.facts, "workspace": str(context.workspace)}

    def render(template: str) -> str:
        return f"{spec.name}/{render_key(template, facts, lambda p: files_hash(context.workspace, p))}"

    key = render(spec.key)
    if len(key) > MAX_KEY_CHARS:
        raise CacheMiss(f"its key is {len(key)} characters rendered, more than {MAX_KEY_CHARS}")
    return key, [render(template) for template in spec.restore_keys]


# ---------------------------------------------------------------------- restore


def restore_caches(specs: tuple[CacheSpec, ...], context: CacheContext) -> list[CacheRun]:
    return [restore_cache(spec, context) for spec in specs]


def restore_cache(spec: CacheSpec, context: CacheContext) -> CacheRun:
    started = time.monotonic()
    try:
        key, prefixes = keys_of(spec, context)
    except (CacheMiss, OSError, HandoffFailure) as exc:
        context.emit(f"[relevo] cache {spec.name}: miss (its key could not be made: {exc})")
        return CacheRun(spec, "", CacheOutcome(name=spec.name, key="", restore="miss", reason=str(exc)))
    run = CacheRun(spec, key, CacheOutcome(name=spec.name, key=key, restore="miss"))
    try:
        record, kind = _find(context, key, prefixes)
        if record is None:
            context.emit(
                f"[relevo] cache {spec.name}: miss: no entry for {key}"
                + (f" nor a key starting with {', '.join(prefixes)}" if prefixes else "")
            )
            run.outcome = run.outcome.model_copy(update={"restore_seconds": _since(started)})
            return run
        _touch(context, record.cache_key)
        result, known = _restore_entry(context, record)
    except Stopped:
        raise
    except (CacheMiss, HandoffFailure, ClientError, BotoCoreError, OSError) as exc:
        why = exc.message if isinstance(exc, HandoffFailure) else str(exc)
        context.emit(f"[relevo] cache {spec.name}: miss: the entry could not be restored ({why})")
        run.outcome = run.outcome.model_copy(update={"reason": why, "restore_seconds": _since(started)})
        return run
    run.known = known
    run.outcome = run.outcome.model_copy(
        update={
            "restore": kind,
            "restored_key": record.cache_key,
            "bytes": result.bytes,
            "downloaded_bytes": result.restored_bytes,
            "restore_seconds": _since(started),
            "digest": result.digest,
        }
    )
    try:
        cache_entries.count_hit(
            context.ref.table, context.scope, record.cache_key, context.clock().isoformat(), context.agent_id
        )
    except (ClientError, BotoCoreError) as exc:
        log.warning("cache %s: its hit was not counted (%s)", spec.name, exc)
    context.emit(
        f"[relevo] cache {spec.name}: {'hit' if kind == 'hit' else 'partial hit'} {record.cache_key}: "
        f"{result.files} file(s), {human_bytes(result.bytes)} in {run.outcome.restore_seconds:.1f}s, "
        f"{human_bytes(result.restored_bytes)} downloaded, {human_bytes(result.cached_bytes)} from this "
        f"Mac's cache; tree digest {result.digest}"
    )
    return run


def _touch(context: CacheContext, cache_key: str) -> None:
    """The entry marked as used before its bytes are fetched: eviction spares it meanwhile."""
    try:
        cache_entries.touch(context.ref.table, context.scope, cache_key, context.clock().isoformat())
    except (ClientError, BotoCoreError) as exc:
        log.warning("cache entry %s: its use was not recorded before its restore (%s)", cache_key, exc)


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


def _find(
    context: CacheContext, key: str, prefixes: list[str]
) -> tuple[cache_entries.CacheEntryRecord | None, Any]:
    table = context.ref.table
    record = cache_entries.get_entry(table, context.scope, key)
    if record is not None:
        return record, "hit"
    for prefix in prefixes:
        record = cache_entries.newest_with_prefix(table, context.scope, prefix)
        if record is not None:
            return record, "partial"
    return None, "miss"


def read_entry(context: CacheContext, record: cache_entries.CacheEntryRecord) -> CacheEntry:
    """The entry's manifest, its sha256 the record's, its key the record's, its paths safe."""
    name = f"{context.prefix}{entry_object(record.cache_key)}"
    try:
        data = client("s3").get_object(Bucket=context.bucket, Key=name)["Body"].read()
    except ClientError as exc:
        if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
            raise CacheMiss(f"s3://{context.bucket}/{name} is gone") from exc
        raise
    actual = hashlib.sha256(data).hexdigest()
    if actual != record.manifest_sha256:
        raise CacheMiss(f"its manifest has sha256 {actual}, its record says {record.manifest_sha256}")
    try:
        entry = CacheEntry.model_validate(json.loads(data))
    except (ValueError, ValidationError) as exc:
        raise CacheMiss(f"its manifest cannot be read: {exc}") from exc
    if entry.key != record.cache_key:
        raise CacheMiss(f"its manifest is of key {entry.key!r}, not {record.cache_key!r}")
    for root, manifest in entry.trees.items():
        check_entries(f"cache {record.cache_key} ({root})", manifest.entries, links_out=True)
    return entry


def entry_digest(trees: dict[Root, Manifest]) -> str:
    """An entry's tree digest: its one tree's (the handoff's tree_digest), or of several roots
    each root's, named."""
    if len(trees) == 1:
        return tree_digest(next(iter(trees.values())).entries)
    named = "".join(f"{root}:{tree_digest(manifest.entries)}\n" for root, manifest in sorted(trees.items()))
    return hashlib.sha256(named.encode()).hexdigest()


def tops(manifest: Manifest) -> list[str]:
    """The paths of a tree no other path of it holds: what is moved into place, each whole."""
    paths = {entry.path for entry in manifest.entries}
    return [path for path in sorted(paths) if not any(parent in paths for parent in _parents(path))]


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:end]) for end in range(1, len(parts))]


def _restore_entry(
    context: CacheContext, record: cache_entries.CacheEntryRecord
) -> tuple[RestoreResult, dict[str, Location]]:
    entry = read_entry(context, record)
    total = RestoreResult()
    known: dict[str, Location] = {}
    staged: list[tuple[Path, Path, Manifest]] = []
    try:
        for root, manifest in entry.trees.items():
            staging = context.root(root) / STAGING_DIR / uuid.uuid4().hex
            staging.mkdir(parents=True)
            staged.append((context.root(root), staging, manifest))
            if context.owner is not None:
                # Each file placed in it is then the build user's as it is written (handoff.place
                # gives a file its directory's owner before its mode and before any link to it).
                _give(context.owner, staging)
            result = RestoreResult()
            place_tree(
                merge([(manifest, context.bucket, context.prefix)]),
                staging,
                context.content_cache,
                context.emit,
                context.cancel,
                result,
            )
            expected = tree_digest(manifest.entries)
            if result.digest != expected:
                raise CacheMiss(f"the restored tree's digest {result.digest} is not the entry's {expected}")
            for field_name in ("files", "bytes", "restored_bytes", "cached_bytes", "present_bytes"):
                setattr(total, field_name, getattr(total, field_name) + getattr(result, field_name))
            for file in manifest.files:
                assert file.sha256 is not None and file.object is not None
                known[file.sha256] = Location(file.object, file.offset)
        # Everything is verified: only now is anything of the workspace (or home) replaced, and
        # never through a symlink of it (a checkout's link could lead anywhere).
        for root_path, _, manifest in staged:
            for top in tops(manifest):
                above = real_parents(root_path, top)
                if above is not None:
                    raise CacheMiss(f"{top} lies under {above}, which is not a directory (a symlink)")
        if context.owner is not None:
            for _, staging, _ in staged:
                context.owner.hand_over(staging)  # its directories and links too
        for root_path, staging, manifest in staged:
            for top in tops(manifest):
                destination = root_path / top
                made = [parent for parent in destination.relative_to(root_path).parents if parent.name]
                made = [root_path / parent for parent in reversed(made) if not (root_path / parent).exists()]
                destination.parent.mkdir(parents=True, exist_ok=True)
                if context.owner is not None:
                    for directory in made:  # `~/Library/Caches` made for `~/Library/Caches/tool`
                        _give(context.owner, directory)
                if os.path.lexists(destination):
                    remove_path(destination)
                os.replace(staging / top, destination)
        total.digest = entry_digest(entry.trees)
        return total, known
    finally:
        for root_path, staging, _ in staged:
            shutil.rmtree(staging, ignore_errors=True)
            try:
                (root_path / STAGING_DIR).rmdir()
            except OSError:
                pass


def _give(owner: BuildUser, directory: Path) -> None:
    """A directory the agent just made, the build user's (opened without following a link)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        owner.own(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- save


class _CacheUpload(HandoffUpload):
    """The handoff's upload, under the project's cache prefix: no job quota, no job records."""

    def __post_init__(self) -> None:
        self.known = dict(self.known)
        self.s3 = client("s3")

    def check_quota(self) -> None:
        return None


def save_caches(runs: list[CacheRun], context: CacheContext, succeeded: bool) -> None:
    for run in runs:
        if run.key and (succeeded or run.spec.save == "always"):
            save_cache(run, context)


def save_cache(run: CacheRun, context: CacheContext) -> None:
    """The entry of `run.key` stored, unless it has one; run.outcome says what became of it."""
    started = time.monotonic()
    name = run.spec.name

    def done(save: str, reason: str | None = None, **counts: Any) -> None:
        run.outcome = run.outcome.model_copy(
            update={
                "save": save,
                "reason": reason or run.outcome.reason,
                "save_seconds": _since(started),
                **counts,
            }
        )

    if run.outcome.restore == "hit":
        done("exists")
        return
    if not context.writable:
        done("not_saved", "this job's ref does not write the project's caches (cache_write_refs)")
        context.emit(f"[relevo] cache {name}: not saved: this job's ref does not write the project's caches")
        return
    try:
        trees: dict[Root, Manifest] = {}
        uploaded, size, files = 0, 0, 0
        for root in ("workspace", "home"):
            patterns = tuple(
                normal_pattern(relative)
                for declared in run.spec.paths
                for (where, relative) in [split_cache_path(declared)]
                if where == root and matches(context.root(root), normal_pattern(relative))
            )
            if not patterns:
                continue
            upload = _CacheUpload(
                context.ref,
                context.stage,
                context.root(root),
                patterns,
                f"s3://{context.bucket}/{context.prefix}",
                0,
                run.known,
                context.content_cache,
                context.emit,
                context.cancel,
                links_out=True,
            )
            upload.bucket, upload.prefix = context.bucket, context.prefix
            upload.hash_tree()
            upload.keep_out_stored()
            upload.send_objects()
            trees[root] = upload.manifest()
            uploaded += sum(stored for _, stored in upload.stored)
            size += sum(entry.size for entry in upload.files)
            files += len(upload.files)
            run.known.update(upload.locations)
        if not trees:
            done("skipped", "none of its paths exists")
            context.emit(f"[relevo] cache {name}: not saved: none of {', '.join(run.spec.paths)} exists")
            return
        data = json.dumps(
            CacheEntry(key=run.key, trees=trees).model_dump(mode="json"), separators=(",", ":")
        ).encode()
        put = _put_entry(context, run.key, data)
        record = cache_entries.CacheEntryRecord(
            cache_key=run.key,
            manifest_sha256=hashlib.sha256(put).hexdigest(),
            size=size,
            files=files,
            created_at=context.clock().isoformat(),
            job_id=context.ref.job_id,
            stage=context.stage,
            last_used_at=context.clock().isoformat(),
        )
        written = cache_entries.put_entry(context.ref.table, context.scope, record, context.agent_id)
    except Stopped:
        raise
    except (HandoffFailure, ClientError, BotoCoreError, OSError) as exc:
        why = exc.message if isinstance(exc, HandoffFailure) else str(exc)
        done("failed", why)
        context.emit(f"[relevo] cache {name}: not saved: {why}")
        return
    if put is not data or not written:
        done("exists", "another job saved this key first")
        context.emit(f"[relevo] cache {name}: {run.key} was saved by another job meanwhile; its entry stays")
        return
    done("saved", saved_bytes=size, uploaded_bytes=uploaded, digest=entry_digest(trees))
    context.emit(
        f"[relevo] cache {name}: saved {run.key}: {files} file(s), {human_bytes(size)} "
        f"({human_bytes(uploaded)} uploaded, {run.outcome.save_seconds:.1f}s)"
    )


def _put_entry(context: CacheContext, key: str, data: bytes) -> bytes:
    """The entry's manifest put once; returns what the key holds: `data`, or the manifest another
    job stored first (412 PreconditionFailed), whose record is then written if it is missing."""
    s3, name = client("s3"), f"{context.prefix}{entry_object(key)}"
    try:
        s3.put_object(
            Bucket=context.bucket,
            Key=name,
            Body=data,
            ContentMD5=base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode(),
            ContentType="application/json",
            IfNoneMatch="*",
        )
        return data
    except ClientError as exc:
        if error_code(exc) not in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
            raise
    return bytes(s3.get_object(Bucket=context.bucket, Key=name)["Body"].read())
