"""This Mac's copies of handed-on files, by sha256: <workspace_root>/.relevo-cache/sha256/<ab>/<sha256>.

The checkout's `git clean` removes a stage's build products from the workspace before the next
stage runs, even on the same Mac. The cache keeps each file the agent stored or restored, so the
next stage here copies it back instead of downloading it: a same-Mac restore moves 0 bytes.

An entry is a copy-on-write clone where the file system has them (APFS clonefile(2), Btrfs/XFS
FICLONE), else a hard link to the workspace file: a link shares the file's inode, so a command
that rewrites the file in place changes the entry too. Nothing trusts an entry for that reason:
every copy out of the cache is hashed as it is written, and an entry whose bytes no longer match
its name is dropped (the file is then downloaded and verified like any other). Entries are never
touched (a link's times are the workspace file's). Between stages, entries no workspace file holds
any more (one link left) are removed, oldest first, while the cache is over `max_bytes`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_DIR = ".relevo-cache"
_BLOCK = 1024 * 1024
_FICLONE = 0x40049409  # linux/fs.h


def _clone(source: Path, destination: Path) -> bool:
    """A copy-on-write copy, where the file system makes one; False when it does not."""
    if sys.platform == "darwin":
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        return libc.clonefile(os.fsencode(source), os.fsencode(destination), 0x0001) == 0  # CLONE_NOFOLLOW
    try:
        with open(source, "rb") as src, open(destination, "xb") as dst:
            fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
        return True
    except OSError:
        try:
            os.unlink(destination)
        except FileNotFoundError:
            pass
        return False


class HandoffCache:
    def __init__(self, workspace_root: Path, max_bytes: int | None) -> None:
        self.root = workspace_root / CACHE_DIR / "sha256"
        self.max_bytes = max_bytes
        # Once the file system says it makes no clones, entries are hard links without asking again.
        self._clones = True
        self._shards: set[str] = set()

    def path(self, sha256: str) -> Path:
        return self.root / sha256[:2] / sha256

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def keep(self, source: Path, sha256: str) -> None:
        """`source` (whose bytes are `sha256`, just verified) becomes the entry, if there is none."""
        entry = self.path(sha256)
        if sha256[:2] not in self._shards:
            entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._shards.add(sha256[:2])
        if not self._clones:
            try:
                os.link(source, entry)  # atomic: the entry is whole or absent
            except FileExistsError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSPC, errno.EMLINK, errno.EPERM):
                    log.warning("handoff cache: could not keep %s (%s)", source, exc)
            return
        if entry.exists():
            return
        partial = entry.with_name(f".{sha256}.{os.getpid()}.{id(source)}")
        try:
            if not _clone(source, partial):
                self._clones = False
                os.link(source, partial)
            os.replace(partial, entry)
        except OSError as exc:  # another file system, a full disk: no entry, nothing else changes
            if exc.errno not in (errno.EXDEV, errno.ENOSPC, errno.EEXIST, errno.EMLINK, errno.EPERM):
                log.warning("handoff cache: could not keep %s (%s)", source, exc)
            try:
                os.unlink(partial)
            except FileNotFoundError:
                pass

    def copy_out(self, sha256: str, destination: int) -> bool:
        """The entry's bytes written to the open file `destination`, hashed as they go: True when
        they are `sha256`. An entry that is gone or no longer matches is dropped: False."""
        entry = self.path(sha256)
        digest = hashlib.sha256()
        try:
            with open(entry, "rb") as handle:
                for block in iter(lambda: handle.read(_BLOCK), b""):
                    digest.update(block)
                    _write_all(destination, block)
        except FileNotFoundError:
            return False
        if digest.hexdigest() != sha256:
            log.warning("handoff cache: %s no longer holds its bytes (rewritten in place); dropped", entry)
            try:
                os.unlink(entry)
            except FileNotFoundError:
                pass
            return False
        return True

    def prune(self) -> int:
        """Entries no workspace file holds, oldest first, while the cache is over max_bytes.
        Returns the bytes freed."""
        if self.max_bytes is None or not self.root.is_dir():
            return 0
        entries = []
        for path in self.root.glob("*/*"):
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue
            entries.append((info.st_ctime_ns, info.st_size, info.st_nlink, path))
        total = sum(size for _, size, links, _ in entries if links == 1)
        freed = 0
        for _, size, links, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if links != 1:
                continue  # a workspace file holds it: removing the entry frees nothing
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            total -= size
            freed += size
        return freed


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
