"""Trees of files as a build leaves them, and what a test compares of them, computed here from
the disk without the agent's code: each path's type, mode, mtime (ns), bytes and link target.

Run as a script (`python tests/helpers/tree.py ROOT PATH...`) it prints one sha256 over the
listing: what the e2e chain's stages print on each Mac, to compare near and far side.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

# Odd, distinct mtimes with nanoseconds, as a build leaves them (codesign reads them).
_MTIME = 1_700_000_000_123_456_789


def make_bundle(root: Path, large_bytes: int = 0, seed: int = 1) -> None:
    """build/App.app like an iOS bundle (a framework with Versions/Current and top-level links, an
    executable, resources), an empty directory, two files with the same bytes and, with
    `large_bytes`, one large file."""
    app = root / "build" / "App.app"
    framework = app / "Frameworks" / "Kit.framework"
    (framework / "Versions" / "A" / "Resources").mkdir(parents=True)
    (app / "_CodeSignature").mkdir(parents=True)
    (root / "build" / "empty").mkdir(parents=True)
    files = {
        app / "App": (b"\xcf\xfa\xed\xfe" + os.urandom(4000) + bytes([seed]), 0o755),
        app / "Info.plist": (
            b"<plist><dict><key>CFBundleVersion</key><string>42</string></dict></plist>\n",
            0o644,
        ),
        app / "_CodeSignature" / "CodeResources": (os.urandom(900), 0o644),
        framework / "Versions" / "A" / "Kit": (b"\xcf\xfa\xed\xfe" + os.urandom(2500), 0o755),
        framework / "Versions" / "A" / "Resources" / "Info.plist": (b"<plist/>\n", 0o644),
        app / "en.lproj.strings": (b"same bytes\n", 0o600),
        app / "fr.lproj.strings": (b"same bytes\n", 0o640),
        root / "build" / "notes.txt": (b"release notes\n", 0o644),
    }
    if large_bytes:
        files[app / "Assets.car"] = (os.urandom(large_bytes), 0o644)
    for number, (path, (data, mode)) in enumerate(sorted(files.items())):
        path.write_bytes(data)
        os.chmod(path, mode)
        os.utime(path, ns=(_MTIME, _MTIME + number * 1_001))
    os.symlink("A", framework / "Versions" / "Current")
    os.symlink("Versions/Current/Kit", framework / "Kit")
    os.symlink("Versions/Current/Resources", framework / "Resources")
    for number, directory in enumerate(
        sorted(p for p in (root / "build").rglob("*") if p.is_dir() and not p.is_symlink())
    ):
        os.utime(directory, ns=(_MTIME, _MTIME + 7 + number))
    if os.utime in os.supports_follow_symlinks:
        for link in (framework / "Versions" / "Current", framework / "Kit"):
            os.utime(link, ns=(_MTIME, _MTIME + 99), follow_symlinks=False)


def tree_listing(root: Path, under: str) -> list[tuple[str, ...]]:
    """(path, type, mode, mtime_ns, sha256 or link target) of `under` and everything in it."""
    listing = []
    start = root / under
    paths = [start, *sorted(start.rglob("*"))] if start.is_dir() and not start.is_symlink() else [start]
    for path in paths:
        info = os.lstat(path)
        relative = path.relative_to(root).as_posix()
        if stat.S_ISLNK(info.st_mode):
            mtime = str(info.st_mtime_ns) if os.utime in os.supports_follow_symlinks else ""
            listing.append((relative, "symlink", "", mtime, os.readlink(path)))
        elif stat.S_ISDIR(info.st_mode):
            listing.append((relative, "dir", oct(stat.S_IMODE(info.st_mode)), str(info.st_mtime_ns), ""))
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            listing.append((relative, "file", oct(stat.S_IMODE(info.st_mode)), str(info.st_mtime_ns), digest))
    return listing


def tree_sha256(root: Path, unders: list[str]) -> str:
    digest = hashlib.sha256()
    for under in unders:
        for row in tree_listing(root, under):
            digest.update("\0".join(row).encode() + b"\n")
    return digest.hexdigest()


if __name__ == "__main__":
    print(tree_sha256(Path(sys.argv[1]), sys.argv[2:]))
