"""How a restored path is put in the workspace: never in place (a temporary name beside it, renamed
over the path once its bytes are verified, with its mode and mtime and the workspace owner's),
never through a symlink, whatever stood there before replaced rather than followed.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import stat
from pathlib import Path

from relevo_agent.handoff.manifests import fail_checksum
from relevo_core.models.handoff import ManifestEntry


def ensure_directory(workspace: Path, relative: str) -> None:
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
            if (
                info.st_mode & 0o700 != 0o700
            ):  # a handed-on directory's own mode comes last; writing into it first
                os.chmod(current, stat.S_IMODE(info.st_mode) | 0o700)
            continue
        os.unlink(current)
        os.mkdir(current)


def remove_path(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


_TEMPORARY = itertools.count()


class Writer:
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
                raise fail_checksum(
                    f"{self.entry.path} from {what}: {self.written} bytes with sha256 {actual}, the "
                    "manifest says "
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


def place_link(workspace: Path, entry: ManifestEntry) -> None:
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
