"""Files only the agent may read: its config, its journal, a stack file (a local stack's holds an
access key). Each is mode 0600 from the moment it exists, whatever the umask, so that a build user
(`run_as`) cannot read it; a file of an older version is tightened when the agent opens it."""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE = 0o600


def write_private(path: Path, text: str) -> Path:
    """`text` as the whole of `path`, mode 0600, replaced at once (a reader sees one or the other)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE)
    os.fchmod(fd, PRIVATE)  # one an earlier crash left with another mode
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(partial, path)
    return path


def keep_private(path: Path) -> None:
    """`path` created empty if missing, and readable by its owner only."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, PRIVATE))
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, PRIVATE)


def tighten(path: Path) -> None:
    """An existing file made readable by its owner only; a missing one is left missing."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if mode & 0o077:
        os.chmod(path, PRIVATE)
