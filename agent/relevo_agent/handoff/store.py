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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

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
    blob_object,
    handoff_base,
    manifest_key,
    pack_object,
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
            f"[relevo] handoff: {self.verb} {human_bytes(self.done)} of {human_bytes(self.total)} at "
            f"{human_bytes(rate)}/s"
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
    return HandoffUpload(
        ref,
        stage,
        workspace,
        patterns,
        artifact_uri,
        expires_at,
        known,
        cache,
        emit,
        cancel,
        max_job_bytes=max_job_bytes,
        bucket_region=bucket_region,
        crosses_region=crosses_region,
    ).store()


@dataclass
class HandoffUpload:
    """One stage attempt's handoff on its way to the job's handoff prefix, a method per step in
    the order `store` takes them: hash the tree, keep out what is stored already, check the quota,
    send the packs and blobs side by side, then the manifest, then record it all fenced on `ref`.
    What the steps share (the digests, the objects stored, where each file's bytes are) is kept
    here; the sending threads add to it under `_lock`."""

    ref: StageRef
    stage: str
    workspace: Path
    patterns: tuple[str, ...]
    artifact_uri: str
    expires_at: int
    # sha256 -> where those bytes are stored: an earlier stage's, and this attempt's as they go.
    known: dict[str, Location]
    cache: HandoffCache | None
    emit: Callable[[str], None]
    cancel: threading.Event
    max_job_bytes: int | None = None
    bucket_region: str = ""
    crosses_region: bool | None = False
    # A cache's tree: symlinks may point outside it (tree.scan).
    links_out: bool = False
    # What the steps find and store.
    found: list[Found] = field(init=False, default_factory=list)
    files: list[Found] = field(init=False, default_factory=list)
    digests: dict[str, str] = field(init=False, default_factory=dict)  # path -> sha256
    # What is new: blobs by digest (one each, even for two paths with the same bytes), and the
    # small files to pack, each digest once.
    new_blobs: dict[str, Found] = field(init=False, default_factory=dict)
    new_small: dict[str, Found] = field(init=False, default_factory=dict)
    adding: int = field(init=False, default=0)
    locations: dict[str, Location] = field(init=False, default_factory=dict)
    stored: list[tuple[str, int]] = field(init=False, default_factory=list)  # (key under the prefix, size)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    # One buffer per pack in flight, allocated once and filled in place for each pack: the
    # store's memory stays PACK_BUFFERS × PACK_BYTES however many packs there are.
    _buffers: queue.SimpleQueue[bytearray] = field(init=False, default_factory=queue.SimpleQueue)
    # Made once what is new is known (send_objects): its rate counts from then.
    _progress: _Progress = field(init=False)

    def __post_init__(self) -> None:
        self.known = dict(self.known)
        self.bucket, self.prefix = handoff_base(self.artifact_uri)
        self.s3 = client("s3")

    def store(self) -> HandoffSummary:
        started = time.monotonic()
        self.hash_tree()
        self.keep_out_stored()
        self.check_quota()
        self.send_objects()
        manifest = self.manifest()
        data = json.dumps(manifest.model_dump(mode="json"), separators=(",", ":")).encode()
        manifest_sha = hashlib.sha256(data).hexdigest()
        manifest_object = self.put_manifest(data, manifest_sha)
        summary = self.summary(manifest, manifest_object, manifest_sha, time.monotonic() - started)
        self.record(summary, manifest_sha)
        self.emit(
            f"[relevo] handoff: {summary.files} file(s), {summary.dirs} dir(s), "
            f"{summary.symlinks} symlink(s), {human_bytes(summary.bytes)} handed on "
            f"({human_bytes(summary.uploaded_bytes)} stored, {summary.seconds:.1f}s); "
            f"tree digest {summary.digest}"
        )
        return summary

    # ------------------------------------------------------------------ what is new
    def hash_tree(self) -> None:
        """Pass 1: every file's sha256 (large ones side by side: hashlib lets go of the GIL)."""
        self.found = scan(self.workspace, self.patterns, self.links_out)
        self.files = [entry for entry in self.found if entry.type == "file"]
        # Each thread takes the next file as it is free (balanced however the large ones fall): a
        # task per thread, not a future per file, which for an .xcarchive's 8,000 files was some
        # 20 MB of the store's peak (bench/handoff.py).
        pending, taking = iter(self.files), threading.Lock()

        def hash_what_is_left() -> list[tuple[str, str]]:
            hashed: list[tuple[str, str]] = []
            while True:
                with taking:
                    entry = next(pending, None)
                if entry is None:
                    return hashed
                hashed.append((entry.path, sha256_file(self.workspace / entry.path)))

        with ThreadPoolExecutor(max_workers=PARALLEL_OBJECTS, thread_name_prefix="handoff-hash") as pool:
            for hashed in pool.map(lambda _: hash_what_is_left(), range(PARALLEL_OBJECTS)):
                self.digests.update(hashed)
        if self.cache is not None:
            for entry in self.files:
                self.cache.keep(self.workspace / entry.path, self.digests[entry.path])

    def keep_out_stored(self) -> None:
        """The files whose bytes are not stored for this job yet; a blob an earlier attempt of this
        job already stored is not sent again."""
        for entry in self.files:
            sha = self.digests[entry.path]
            if sha in self.known:
                continue
            if entry.size >= LARGE_FILE_BYTES:
                self.new_blobs.setdefault(sha, entry)
            else:
                self.new_small.setdefault(sha, entry)
        for sha in list(self.new_blobs):
            if self._exists(blob_object(sha)):
                self.known[sha] = Location(blob_object(sha), 0)
                self.new_blobs.pop(sha)
        self.adding = sum(entry.size for entry in [*self.new_blobs.values(), *self.new_small.values()])

    def _exists(self, name: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=f"{self.prefix}{name}")
            return True
        except ClientError:
            return False

    def check_quota(self) -> None:
        try:
            artifact_store.check_job_quota_bytes(
                self.ref,
                self.stage,
                self.adding,
                self.max_job_bytes,
                what=f"the handoff's {len(self.new_blobs) + len(self.new_small)} new file(s)",
            )
        except artifact_store.QuotaExceeded as exc:
            raise HandoffFailure(ErrorClass.ARTIFACT_QUOTA, f"handoff: {exc}") from None

    # ------------------------------------------------------------------ sending
    def send_objects(self) -> None:
        """Pass 2: packs (in path order, each up to PACK_BYTES) and blobs, PARALLEL_OBJECTS at a time."""
        self._progress = _Progress(self.emit, "stored", self.adding)
        self.locations = dict(self.known)
        for _ in range(min(PACK_BUFFERS, len(self.new_small))):
            self._buffers.put(bytearray(PACK_BYTES))
        packs: list[list[Found]] = [[]]
        for entry in sorted(self.new_small.values(), key=lambda e: e.path):
            if packs[-1] and sum(member.size for member in packs[-1]) + entry.size > PACK_BYTES:
                packs.append([])
            packs[-1].append(entry)
        if self.adding:
            new = len(self.new_blobs) + len(self.new_small)
            self.emit(
                f"[relevo] handoff: storing {new} new file(s), {human_bytes(self.adding)} "
                f"({len(self.files) - new} already stored for this job)"
            )
        with ThreadPoolExecutor(max_workers=PARALLEL_OBJECTS, thread_name_prefix="handoff-put") as pool:
            futures: list[Future[None]] = [
                pool.submit(in_this_context(self.put_pack), members) for members in packs if members
            ]
            futures += [
                pool.submit(in_this_context(self.put_blob), sha, entry)
                for sha, entry in self.new_blobs.items()
            ]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((future.exception() for future in done if future.exception() is not None), None)
            if failed is not None:
                for future in futures:
                    future.cancel()
                raise HandoffFailure(
                    classify_storage_error(failed),
                    f"handoff: storing under s3://{self.bucket}/{self.prefix}: {failed}",
                ) from failed
        if self.cancel.is_set():
            raise HandoffFailure(ErrorClass.AGENT_SHUTDOWN, "handoff: stopped while storing")

    def put_pack(self, members: list[Found]) -> None:
        """Small files one after another in a buffer of `_buffers`, sent as one object."""
        buffer = self._buffers.get()
        try:
            size = sum(member.size for member in members)
            view = memoryview(buffer)[:size]
            offsets, at = {}, 0
            for member in members:
                offsets[self.digests[member.path]] = at
                with open(self.workspace / member.path, "rb") as handle:
                    at += handle.readinto(view[at : at + member.size])
            sha = hashlib.sha256(view).hexdigest()
            if self.cancel.is_set():
                return
            self.s3.put_object(
                Bucket=self.bucket,
                Key=f"{self.prefix}{pack_object(sha)}",
                Body=_Bytes(view),
                ContentMD5=_md5(view),
                Metadata={"sha256": sha},
            )
            view.release()
        finally:
            self._buffers.put(buffer)
        self._progress.add(size)
        with self._lock:
            self.stored.append((pack_object(sha), size))
            for digest, offset in offsets.items():
                self.locations[digest] = Location(pack_object(sha), offset)

    def put_blob(self, sha: str, entry: Found) -> None:
        """A large file, whole, in parallel parts."""
        if self.cancel.is_set():
            return
        self.s3.upload_file(
            str(self.workspace / entry.path),
            self.bucket,
            f"{self.prefix}{blob_object(sha)}",
            ExtraArgs={"Metadata": {"sha256": sha}, "ChecksumAlgorithm": "SHA256"},
            Config=BLOB_TRANSFER,
            Callback=self._progress.add,
        )
        with self._lock:
            self.stored.append((blob_object(sha), entry.size))
            self.locations[sha] = Location(blob_object(sha), 0)

    # ------------------------------------------------------------------ the manifest and its records
    def manifest(self) -> Manifest:
        entries = tuple(_entry(entry, self.digests.get(entry.path), self.locations) for entry in self.found)
        return Manifest(
            job_id=self.ref.job_id,
            stage=self.stage,
            attempt=self.ref.attempt,
            patterns=self.patterns,
            entries=entries,
        )

    def put_manifest(self, data: bytes, manifest_sha: str) -> str:
        """The manifest stored (its key: a shard's its own, the shards of a stage store side by
        side, each attempt numbered apart); returns its key."""
        _, manifest_object = manifest_key(self.artifact_uri, self.stage, self.ref.shard, self.ref.attempt)
        try:
            self.s3.put_object(
                Bucket=self.bucket,
                Key=manifest_object,
                Body=data,
                ContentMD5=_md5(data),
                ContentType="application/json",
                Metadata={"sha256": manifest_sha},
            )
        except Exception as exc:
            raise HandoffFailure(
                classify_storage_error(exc), f"handoff: storing s3://{self.bucket}/{manifest_object}: {exc}"
            ) from exc
        self.stored.append((manifest_object.removeprefix(self.prefix), len(data)))
        return manifest_object

    def summary(
        self, manifest: Manifest, manifest_object: str, manifest_sha: str, seconds: float
    ) -> HandoffSummary:
        uploaded = sum(size for _, size in self.stored)
        crosses = self.crosses_region
        return HandoffSummary(
            manifest=f"s3://{self.bucket}/{manifest_object}",
            manifest_sha256=manifest_sha,
            attempt=self.ref.attempt,
            files=len(self.files),
            dirs=sum(1 for entry in self.found if entry.type == "dir"),
            symlinks=sum(1 for entry in self.found if entry.type == "symlink"),
            bytes=sum(entry.size for entry in self.files),
            uploaded_bytes=uploaded,
            digest=tree_digest(manifest.entries),
            stored_at=datetime.now(UTC).isoformat(),
            cross_region_bytes=None if crosses is None else (uploaded if crosses else 0),
            seconds=round(seconds, 3),
        )

    def record(self, summary: HandoffSummary, manifest_sha: str) -> None:
        """An artifact record for each object stored, and the summary on the stage record, fenced
        on the attempt in one transaction (LeaseLost: a zombie's objects are never recorded)."""
        records = [
            artifact_store.ArtifactRecord(
                job_id=self.ref.job_id,
                stage=self.stage,
                path=f"{HANDOFF_DIR}/{key}",
                uri=f"s3://{self.bucket}/{self.prefix}{key}",
                size=size,
                sha256=key.rsplit("/", 1)[1] if not key.startswith("manifests/") else manifest_sha,
                bucket_region=self.bucket_region,
                cross_region_bytes=size if self.crosses_region else 0,
                attempt=self.ref.attempt,
                agent_id=self.ref.agent_id,
                uploaded_at=summary.stored_at,
                kind="handoff",
                shard=self.ref.shard,
            )
            for key, size in self.stored
        ]
        artifact_store.record_handoff(self.ref, records, summary.model_dump(mode="json"), self.expires_at)


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
