"""The bytes a restore could not find on this Mac, fetched: a pack's range, a blob in one stream,
PARALLEL_OBJECTS objects at a time, each file hashed as it is written (relevo_agent.handoff.place)
and kept in this Mac's handoff cache; paths with the same bytes copied from the first, verified again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from relevo_agent.artifacts import classify_storage_error
from relevo_agent.handoff import HandoffFailure, Stopped
from relevo_agent.handoff.cache import HandoffCache
from relevo_agent.handoff.manifests import Placed
from relevo_agent.handoff.place import Writer
from relevo_agent.handoff.store import PARALLEL_OBJECTS, _Progress
from relevo_agent.handoff.tree import READ_BLOCK
from relevo_core.aws import client, error_code, in_this_context
from relevo_core.models.errors import ErrorClass
from relevo_core.models.transfer import human_bytes


def fetch_files(
    workspace: Path,
    items: list[Placed],
    cache: HandoffCache | None,
    emit: Callable[[str], None],
    cancel: threading.Event,
) -> int:
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
    emit(
        f"[relevo] handoff: downloading {len(items)} file(s), {human_bytes(total)}, from {len(by_object)} "
        "object(s)"
    )

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
                    ErrorClass.HANDOFF_GONE,
                    f"handoff: {uri} is no longer stored (expired, or removed by artifact.max_total_bytes)",
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
        writer = Writer(workspace, other.entry)
        try:
            with open(workspace / first.entry.path, "rb") as handle:
                for block in iter(lambda: handle.read(READ_BLOCK), b""):
                    writer.write(block)
            writer.finish(first.entry.path)
        except BaseException:
            writer.abandon()
            raise


def _pack(
    s3,
    bucket: str,
    key: str,
    uri: str,
    workspace: Path,
    members: list[Placed],
    cache: HandoffCache | None,
    count: Callable[[int], None],
    cancel: threading.Event,
) -> None:
    groups = _same_bytes(members)
    firsts = sorted((group[0] for group in groups.values()), key=lambda m: m.entry.offset)
    start = firsts[0].entry.offset
    end = max(m.entry.offset + m.entry.size for m in firsts)
    if end == start:  # only empty files
        for first in firsts:
            writer = Writer(workspace, first.entry)
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
        writer = Writer(workspace, entry)
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

    def __init__(self, body: Any, count: Callable[[int], None]) -> None:
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


def _blob(
    s3,
    bucket: str,
    key: str,
    uri: str,
    workspace: Path,
    members: list[Placed],
    cache: HandoffCache | None,
    count: Callable[[int], None],
) -> None:
    """A large file in one stream, hashed as it is written (no second read). Objects are fetched
    PARALLEL_OBJECTS at a time, so a tree's few large files still come side by side."""
    first = members[0]
    writer = Writer(workspace, first.entry)
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
