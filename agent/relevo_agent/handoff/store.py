"""A succeeded stage's handoff stored under its job's artifact_uri, in `.relevo-handoff/`:

    packs/<sha256>          small files (< LARGE_FILE_BYTES) one after another, up to PACK_BYTES
    blobs/<sha256>          a large file, whole (a multipart upload in parallel parts)
    manifests/<stage>.<attempt>.json   (a shard's: <stage>.shard-<k>.<attempt>.json)
                            every path: type, mode, mtime, size, sha256, link target, and where
                            its bytes are (object and offset)

Content-addressed, and why: an object is named by the sha256 of its bytes, so the files a stage
hands on unchanged from an earlier stage of the same job (a sign stage re-handing the unsigned
parts of a bundle) are referenced, not stored again, and a retry re-uploads no blob an earlier
attempt stored; and a name that is its own checksum lets the restore verify every byte against
the manifest without trusting the store. Small files are packed because a tree of 20,000 files
(an .xcarchive) would otherwise cost 20,000 requests each way.

Before anything is uploaded: the tree is read (tree.scan) and hashed, and what it adds must fit
the project's artifact.max_job_bytes (Relevo.Fatal.ArtifactQuota). Every new object gets an
artifact record (kind "handoff"), and the attempt's summary (`handoff_stored` on its stage record),
all fenced on the attempt in one transaction: a zombie's objects are never recorded, so no later
stage reads them. The summary rides in the stage's receipt; a later stage restores only what a
succeeded stage's receipt names (relevo_agent.handoff.restore).

Integrity in transit: each pack is sent with its Content-MD5 and each blob's parts with their
SHA-256 checksums, which S3 checks on arrival (BadDigest; "Checking object integrity", S3 User
Guide); the emulator does not check them, and the restore verifies every byte anyway.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from relevo_agent.artifacts import classify_storage_error
from relevo_agent.handoff import HandoffFailure
from relevo_agent.handoff.cache import HandoffCache
from relevo_agent.handoff.tree import Found, scan, sha256_file
from relevo_core.aws import client, in_this_context
from relevo_core.models.errors import ErrorClass
from relevo_core.models.handoff import (
    HANDOFF_DIR,
    LARGE_FILE_BYTES,
    PACK_BYTES,
    HandoffSummary,
    Manifest,
    ManifestEntry,
    handoff_base,
    manifest_key,
    tree_digest,
)
from relevo_core.models.transfer import human_bytes
from relevo_core.store import artifacts as artifact_store
from relevo_core.store.stage_attempts import StageRef

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

log = logging.getLogger(__name__)

# Objects in flight at once; each blob's upload also sends its parts in parallel (BLOB_TRANSFER).
PARALLEL_OBJECTS = 4
# Packs being filled or sent at once (each a PACK_BYTES buffer): the store's memory bound.
PACK_BUFFERS = 3
BLOB_TRANSFER = TransferConfig(
    multipart_threshold=LARGE_FILE_BYTES,
    multipart_chunksize=8 * 1024 * 1024,
    max_concurrency=4,
    max_io_queue=16,
)
PROGRESS_INTERVAL_SEC = 3.0


@dataclass(frozen=True)
class Location:
    """Where an earlier stage of this job stored a file's bytes."""

    object: str
    offset: int


def base_of_manifest(manifest_uri: str) -> tuple[str, str]:
    """(bucket, handoff prefix) a manifest's object keys are relative to."""
    parsed = urlparse(manifest_uri)
    key = parsed.path.lstrip("/")
    return parsed.netloc, key[: key.rindex("manifests/")]


class _Progress:
    def __init__(self, emit: Callable[[str], None], verb: str, total: int) -> None:
        self.emit, self.verb, self.total = emit, verb, total
        self.done = 0
        self.started = self._last = time.monotonic()
        self._lock = threading.Lock()

    def add(self, amount: int) -> None:
        with self._lock:
            self.done += amount
            now = time.monotonic()
            if now - self._last < PROGRESS_INTERVAL_SEC or self.done >= self.total:
                return
            self._last = now
            rate = self.done / max(now - self.started, 1e-6)
        self.emit(
            f"[relevo] handoff: {self.verb} {human_bytes(self.done)} of {human_bytes(self.total)} at {human_bytes(rate)}/s"
        )


def _md5(data: bytes | bytearray | memoryview) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


class _Bytes(io.RawIOBase):
    """A request body read out of a buffer without copying it whole (botocore reads a file-like
    body in blocks to sign and send it, and seeks back to retry)."""

    def __init__(self, view: memoryview) -> None:
        self._view, self._at = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, into: WriteableBuffer) -> int:
        target = memoryview(into)
        piece = self._view[self._at : self._at + len(target)]
        target[: len(piece)] = piece
        self._at += len(piece)
        return len(piece)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._view)}[whence]
        self._at = max(0, min(len(self._view), base + offset))
        return self._at

    def tell(self) -> int:
        return self._at

    def __len__(self) -> int:
        return len(self._view)


def store_handoff(
    ref: StageRef,
    stage: str,
    workspace: Path,
    patterns: tuple[str, ...],
    artifact_uri: str,
    expires_at: int,
    known: dict[str, Location],
    cache: HandoffCache | None,
    emit: Callable[[str], None],
    cancel: threading.Event,
    max_job_bytes: int | None = None,
    bucket_region: str = "",
    crosses_region: bool | None = False,
) -> HandoffSummary:
    """Store what `patterns` match in `workspace` (the command has ended) and record it, fenced on
    `ref`. `known`: sha256 -> where an earlier stage of this job stored those bytes. Raises
    HandoffFailure, or LeaseLost when the records were refused (the attempt is no longer held)."""
    started = time.monotonic()
    known = dict(known)
    found = scan(workspace, patterns)
    files = [entry for entry in found if entry.type == "file"]
    # Pass 1: every file's sha256 (large ones side by side: hashlib lets go of the GIL).
    with ThreadPoolExecutor(max_workers=PARALLEL_OBJECTS, thread_name_prefix="handoff-hash") as pool:
        digests = dict(
            zip(
                (f.path for f in files),
                pool.map(lambda f: sha256_file(workspace / f.path), files),
                strict=True,
            )
        )
    if cache is not None:
        for entry in files:
            cache.keep(workspace / entry.path, digests[entry.path])
    bucket, prefix = handoff_base(artifact_uri)
    s3 = client("s3")
    # What is new: blobs by digest (one each, even for two paths with the same bytes), and the
    # small files to pack, each digest once.
    new_blobs: dict[str, Found] = {}
    new_small: dict[str, Found] = {}
    for entry in files:
        sha = digests[entry.path]
        if sha in known:
            continue
        if entry.size >= LARGE_FILE_BYTES:
            new_blobs.setdefault(sha, entry)
        else:
            new_small.setdefault(sha, entry)
    # A blob an earlier attempt of this job already stored is not sent again.
    for sha in list(new_blobs):
        if _exists(s3, bucket, f"{prefix}blobs/{sha}"):
            known[sha] = Location(f"blobs/{sha}", 0)
            new_blobs.pop(sha)
    adding = sum(entry.size for entry in new_blobs.values()) + sum(entry.size for entry in new_small.values())
    try:
        artifact_store.check_job_quota_bytes(
            ref,
            stage,
            adding,
            max_job_bytes,
            what=f"the handoff's {len(new_blobs) + len(new_small)} new file(s)",
        )
    except artifact_store.QuotaExceeded as exc:
        raise HandoffFailure(ErrorClass.ARTIFACT_QUOTA, f"handoff: {exc}") from None
    progress = _Progress(emit, "stored", adding)
    locations: dict[str, Location] = dict(known)
    stored: list[tuple[str, int]] = []  # (object key relative to the prefix, size)
    stored_lock = threading.Lock()

    # One buffer per pack in flight, allocated once and filled in place for each pack: the
    # store's memory stays PACK_BUFFERS × PACK_BYTES however many packs there are.
    buffers: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
    for _ in range(min(PACK_BUFFERS, len(new_small))):
        buffers.put(bytearray(PACK_BYTES))

    def put_pack(members: list[Found]) -> None:
        buffer = buffers.get()
        try:
            size = sum(member.size for member in members)
            view = memoryview(buffer)[:size]
            offsets, at = {}, 0
            for member in members:
                offsets[digests[member.path]] = at
                with open(workspace / member.path, "rb") as handle:
                    at += handle.readinto(view[at : at + member.size])
            sha = hashlib.sha256(view).hexdigest()
            if cancel.is_set():
                return
            s3.put_object(
                Bucket=bucket,
                Key=f"{prefix}packs/{sha}",
                Body=_Bytes(view),
                ContentMD5=_md5(view),
                Metadata={"sha256": sha},
            )
            view.release()
        finally:
            buffers.put(buffer)
        progress.add(size)
        with stored_lock:
            stored.append((f"packs/{sha}", size))
            for digest, offset in offsets.items():
                locations[digest] = Location(f"packs/{sha}", offset)

    def put_blob(sha: str, entry: Found) -> None:
        if cancel.is_set():
            return
        s3.upload_file(
            str(workspace / entry.path),
            bucket,
            f"{prefix}blobs/{sha}",
            ExtraArgs={"Metadata": {"sha256": sha}, "ChecksumAlgorithm": "SHA256"},
            Config=BLOB_TRANSFER,
            Callback=progress.add,
        )
        with stored_lock:
            stored.append((f"blobs/{sha}", entry.size))
            locations[sha] = Location(f"blobs/{sha}", 0)

    # Pass 2: packs (in path order, each up to PACK_BYTES) and blobs, PARALLEL_OBJECTS at a time.
    packs: list[list[Found]] = [[]]
    for entry in sorted(new_small.values(), key=lambda e: e.path):
        if packs[-1] and sum(member.size for member in packs[-1]) + entry.size > PACK_BYTES:
            packs.append([])
        packs[-1].append(entry)
    if adding:
        emit(
            f"[relevo] handoff: storing {len(new_blobs) + len(new_small)} new file(s), {human_bytes(adding)} "
            f"({len(files) - len(new_blobs) - len(new_small)} already stored for this job)"
        )
    with ThreadPoolExecutor(max_workers=PARALLEL_OBJECTS, thread_name_prefix="handoff-put") as pool:
        futures: list[Future[None]] = [
            pool.submit(in_this_context(put_pack), members) for members in packs if members
        ]
        futures += [pool.submit(in_this_context(put_blob), sha, entry) for sha, entry in new_blobs.items()]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((future.exception() for future in done if future.exception() is not None), None)
        if failed is not None:
            for future in futures:
                future.cancel()
            raise HandoffFailure(
                classify_storage_error(failed), f"handoff: storing under s3://{bucket}/{prefix}: {failed}"
            ) from failed
    if cancel.is_set():
        raise HandoffFailure(ErrorClass.AGENT_SHUTDOWN, "handoff: stopped while storing")
    entries = tuple(_entry(entry, digests.get(entry.path), locations) for entry in found)
    manifest = Manifest(
        job_id=ref.job_id, stage=stage, attempt=ref.attempt, patterns=patterns, entries=entries
    )
    data = json.dumps(manifest.model_dump(mode="json"), separators=(",", ":")).encode()
    manifest_sha = hashlib.sha256(data).hexdigest()
    # A shard's its own: the shards of a stage store side by side, each attempt numbered apart.
    _, manifest_object = manifest_key(artifact_uri, stage, ref.shard, ref.attempt)
    try:
        s3.put_object(
            Bucket=bucket,
            Key=manifest_object,
            Body=data,
            ContentMD5=_md5(data),
            ContentType="application/json",
            Metadata={"sha256": manifest_sha},
        )
    except Exception as exc:
        raise HandoffFailure(
            classify_storage_error(exc), f"handoff: storing s3://{bucket}/{manifest_object}: {exc}"
        ) from exc
    stored.append((manifest_object.removeprefix(prefix), len(data)))
    now = datetime.now(UTC).isoformat()
    uploaded = sum(size for _, size in stored)
    summary = HandoffSummary(
        manifest=f"s3://{bucket}/{manifest_object}",
        manifest_sha256=manifest_sha,
        attempt=ref.attempt,
        files=len(files),
        dirs=sum(1 for entry in found if entry.type == "dir"),
        symlinks=sum(1 for entry in found if entry.type == "symlink"),
        bytes=sum(entry.size for entry in files),
        uploaded_bytes=uploaded,
        digest=tree_digest(entries),
        stored_at=now,
        cross_region_bytes=None if crosses_region is None else (uploaded if crosses_region else 0),
        seconds=round(time.monotonic() - started, 3),
    )
    records = [
        artifact_store.ArtifactRecord(
            job_id=ref.job_id,
            stage=stage,
            path=f"{HANDOFF_DIR}/{key}",
            uri=f"s3://{bucket}/{prefix}{key}",
            size=size,
            sha256=key.rsplit("/", 1)[1] if not key.startswith("manifests/") else manifest_sha,
            bucket_region=bucket_region,
            cross_region_bytes=size if crosses_region else 0,
            attempt=ref.attempt,
            agent_id=ref.agent_id,
            uploaded_at=now,
            kind="handoff",
            shard=ref.shard,
        )
        for key, size in stored
    ]
    artifact_store.record_handoff(ref, records, summary.model_dump(mode="json"), expires_at)
    emit(
        f"[relevo] handoff: {summary.files} file(s), {summary.dirs} dir(s), {summary.symlinks} symlink(s), {human_bytes(summary.bytes)} "
        f"handed on ({human_bytes(uploaded)} stored, {summary.seconds:.1f}s); tree digest {summary.digest}"
    )
    return summary


def _exists(s3: Any, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError:
        return False


def _entry(found: Found, sha256: str | None, locations: dict[str, Location]) -> ManifestEntry:
    if found.type != "file":
        return ManifestEntry(
            path=found.path, type=found.type, mode=found.mode, mtime_ns=found.mtime_ns, target=found.target
        )
    assert sha256 is not None
    where = locations[sha256]
    return ManifestEntry(
        path=found.path,
        type="file",
        mode=found.mode,
        mtime_ns=found.mtime_ns,
        size=found.size,
        sha256=sha256,
        object=where.object,
        offset=where.offset,
    )
