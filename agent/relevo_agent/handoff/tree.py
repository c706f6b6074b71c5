"""What a stage's declared handoff paths hold, read without ever leaving the workspace.

A pattern is a workspace-relative path or glob (`**` spans directories; hidden names match). A
matched directory is taken whole, recursively; a symlink is taken as a link (never followed); a
regular file as a file. The parent of every match must be a real directory of the workspace: a
symlink above a match would hand on (or, at restore, write) what lies outside it. Other kinds of
file (sockets, FIFOs, devices) cannot be handed on. A pattern that matches nothing fails the stage.
"""

from __future__ import annotations

import glob
import hashlib
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from relevo_agent.handoff import HandoffFailure
from relevo_core.models.errors import ErrorClass
from relevo_core.models.handoff import link_target_problem, normal_pattern, path_problem

READ_BLOCK = 1024 * 1024


@dataclass(frozen=True)
class Found:
    """One path of the tree as the stage left it (a file's sha256 is taken when it is stored)."""

    path: str  # workspace-relative, '/'-separated
    type: str  # file, dir, symlink
    mode: int
    mtime_ns: int
    size: int = 0
    target: str | None = None


_BUFFERS = threading.local()


def sha256_file(path: Path | str) -> str:
    """The file's sha256, read through one buffer per thread (no megabyte allocated per read:
    freed buffers are what an allocator keeps)."""
    buffer = getattr(_BUFFERS, "buffer", None)
    if buffer is None:
        buffer = _BUFFERS.buffer = memoryview(bytearray(READ_BLOCK))
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(buffer[:count])
    return digest.hexdigest()


def real_parents(workspace: Path, relative: str) -> str | None:
    """The first ancestor of `relative` (inside the workspace) that is not a real directory, or None."""
    parts = relative.split("/")[:-1]
    current = workspace
    for index, part in enumerate(parts):
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(info.st_mode):
            return "/".join(parts[: index + 1])
    return None


def _found(workspace: Path, relative: str, info: os.stat_result, links_out: bool = False) -> Found:
    mode, path = info.st_mode, workspace / relative
    if stat.S_ISLNK(mode):
        target = os.readlink(path)
        problem = link_target_problem(relative, target) if not links_out else None
        if problem:
            raise HandoffFailure(ErrorClass.HANDOFF_PATH, f"handoff: {relative} is a symlink that {problem}")
        return Found(relative, "symlink", stat.S_IMODE(mode), info.st_mtime_ns, target=target)
    if stat.S_ISDIR(mode):
        return Found(relative, "dir", stat.S_IMODE(mode), info.st_mtime_ns)
    if stat.S_ISREG(mode):
        return Found(relative, "file", stat.S_IMODE(mode), info.st_mtime_ns, size=info.st_size)
    raise HandoffFailure(
        ErrorClass.HANDOFF_PATH,
        f"handoff: {relative} is neither a file, a directory nor a symlink (only those are handed on)",
    )


def _walk(workspace: Path, relative: str, into: dict[str, Found], links_out: bool = False) -> None:
    """A matched directory, everything under it (symlinks as links, never followed)."""
    with os.scandir(workspace / relative) as entries:
        children = sorted(entries, key=lambda entry: entry.name)
    for child in children:
        path = f"{relative}/{child.name}"
        found = _found(workspace, path, child.stat(follow_symlinks=False), links_out)
        into[path] = found
        if found.type == "dir":
            _walk(workspace, path, into, links_out)


def matches(workspace: Path, pattern: str) -> list[str]:
    pattern = normal_pattern(pattern)
    if glob.has_magic(pattern):
        return sorted(glob.glob(pattern, root_dir=workspace, recursive=True, include_hidden=True))
    return [pattern] if os.path.lexists(workspace / pattern) else []


def scan(workspace: Path, patterns: tuple[str, ...], links_out: bool = False) -> list[Found]:
    """Every path the patterns hand on, in path order. Raises HandoffFailure (HandoffMissing when
    a pattern matched nothing, HandoffPath when a path would lead out of the workspace). With
    `links_out` (a cache: a virtual environment's bin/python links to the interpreter), a symlink
    may point anywhere: it is kept as a link, never followed."""
    tree: dict[str, Found] = {}
    missing = []
    for pattern in patterns:
        problem = path_problem(pattern, pattern=True)
        if problem:  # refused at apply; an envelope is checked again all the same
            raise HandoffFailure(ErrorClass.HANDOFF_PATH, f"handoff: {pattern!r} {problem}")
        found = matches(workspace, pattern)
        if not found:
            missing.append(pattern)
            continue
        for relative in found:
            relative = relative.replace(os.sep, "/").rstrip("/")
            if path_problem(relative) or relative.split("/")[0] == ".git":
                continue  # a glob never hands on the checkout's repository
            above = real_parents(workspace, relative)
            if above is not None:
                raise HandoffFailure(
                    ErrorClass.HANDOFF_PATH,
                    f"handoff: {relative} (from {pattern!r}) lies under {above}, which is not a directory "
                    "of the workspace "
                    "(a symlink): only what is inside the workspace is handed on",
                )
            entry = _found(workspace, relative, os.lstat(workspace / relative), links_out)
            tree[relative] = entry
            if entry.type == "dir":
                _walk(workspace, relative, tree, links_out)
    if missing:
        raise HandoffFailure(
            ErrorClass.HANDOFF_MISSING,
            f"handoff: {', '.join(repr(p) for p in missing)} matched nothing in the workspace when the "
            "command ended: "
            "a stage that succeeded without what it hands on has failed",
        )
    return [tree[path] for path in sorted(tree)]
