"""The OS user a stage runs as (`run_as` in the agent's config): who it is, how a command starts
as it, what of the workspace is made its own, and what of the agent's it can read.

The agent runs as root (a LaunchDaemon on macOS) and alone holds its credentials, its journal and
its config. A stage's command, its effect probe, the checkout's git in the workspace and the
project's workspace_cleanup start as the build user: its uid, its primary gid and its own
supplementary groups (what initgroups(3) gives a login), HOME its home, umask 022. The supervisor
and every AWS call stay the agent's. Root may signal any process, so killing a stage's group on a
timeout, a cancel or the fence works as before.

Everything in the stage's workspace is the build user's (`hand_over`, before each command): the
build may rewrite any of it. Root handing a tree to someone else is the classic place for a
symlink or hard-link trick, and another process of the build user (a stage of another project,
something a build left running) may be changing the tree meanwhile. So the walk never follows a
symlink (fwalk, each directory opened relative to its parent and checked to be what was listed),
changes a regular file or a directory (and on macOS a link) only through a descriptor it opened
without following links and checked to be the entry it listed, and leaves alone a file of someone
else with more than one link: the build may have linked a system file into the workspace to have
root give it away. Owners change, nothing else: modes (set-user-ID and set-group-ID bits too, which Linux
clears on chown) and mtimes stay what they were, which codesign depends on.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The mode mask a login shell would give a build: files it makes are its own to write.
BUILD_UMASK = 0o022
_SEARCH, _READ = 0o1, 0o4
_SPECIAL = stat.S_ISUID | stat.S_ISGID


class BuildUserProblem(Exception):
    """`run_as` names no user the agent can run stages as; the message says why."""


@dataclass(frozen=True)
class BuildUser:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # the supplementary groups, the primary one among them
    home: Path

    @classmethod
    def named(cls, name: str) -> BuildUser:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise BuildUserProblem(
                f'no user {name!r} on this machine: create it first (docs/agent.md, "A build user")'
            ) from None
        # macOS's setgroups takes at most NGROUPS_MAX (16); initgroups keeps the first ones too.
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))[: max(1, os.sysconf("SC_NGROUPS_MAX"))]
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, Path(entry.pw_dir))

    def popen(self) -> dict[str, Any]:
        """subprocess.Popen's arguments that start a command as this user (the caller is root)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups), "umask": BUILD_UMASK}

    # ------------------------------------------------------------------ what it may do, by the mode bits

    def _allowed(self, info: os.stat_result, bits: int) -> bool:
        """Whether the mode bits give this user `bits`, in the one class (owner, group, other) it falls in."""
        if info.st_uid == self.uid:
            shift = 6
        elif info.st_gid in self.groups or info.st_gid == self.gid:
            shift = 3
        else:
            shift = 0
        return (info.st_mode >> shift) & bits == bits

    def cannot_reach(self, directory: Path) -> str | None:
        """Why this user could not reach `directory` (the first directory on the way it may not
        search), or None. Of a directory that does not exist yet, the part that exists is judged."""
        real = Path(os.path.realpath(directory))
        for step in [*reversed(real.parents), real]:
            try:
                info = os.stat(step)
            except FileNotFoundError:
                return None
            if not self._allowed(info, _SEARCH):
                return f"{step} is {stat.filemode(info.st_mode)} {user_name(info.st_uid)}"
        return None

    def can_read(self, path: Path) -> bool:
        """Whether this user could open `path` for reading, by the mode bits and owners of it and of
        every directory above it. ACLs are not read: on macOS an ACL may grant more than the bits say."""
        real = Path(os.path.realpath(path))
        try:
            return all(self._allowed(os.stat(step), _SEARCH) for step in real.parents) and self._allowed(
                os.stat(real), _READ
            )
        except FileNotFoundError:
            return False

    # ------------------------------------------------------------------ the workspace made its own

    def hand_over(self, top: Path) -> int:
        """`top` and everything in it made this user's (module docstring); returns how many
        entries changed owner."""
        changed = 0
        for _, directories, files, directory_fd in os.fwalk(top, follow_symlinks=False):
            changed += self._own_open(directory_fd)
            for name in files + directories:
                try:
                    info = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if info.st_uid == self.uid:
                    continue
                if stat.S_ISLNK(info.st_mode):
                    changed += self._own_link(name, directory_fd, info)
                elif stat.S_ISREG(info.st_mode):
                    changed += self._own_file(name, directory_fd, info)
                # Directories are handed over as the walk enters them (a symlink to one is listed
                # with them and was handled above); FIFOs and sockets only a build makes.
        if changed:
            log.info(
                "workspace %s: %d entr%s handed to the build user %s",
                top,
                changed,
                "y" if changed == 1 else "ies",
                self.name,
            )
        return changed

    def _own_link(self, name: str, directory_fd: int, listed: os.stat_result) -> int:
        only_link = getattr(os, "O_SYMLINK", None)  # macOS: open the link itself, never what it names
        if only_link is None:
            # Linux opens no link to chown it: by name, never followed. A link replaced meanwhile by
            # a hard link to someone else's file would hand that file over; Linux's
            # fs.protected_hardlinks (on by default) refuses a user such a link.
            os.chown(name, self.uid, self.gid, dir_fd=directory_fd, follow_symlinks=False)
            return 1
        try:
            fd = os.open(name, only_link | os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory_fd)
        except OSError:
            return 0
        try:
            info = os.fstat(fd)
            if not stat.S_ISLNK(info.st_mode) or (info.st_dev, info.st_ino) != (listed.st_dev, listed.st_ino):
                return 0
            return self._own_open(fd, info)
        finally:
            os.close(fd)

    def _own_file(self, name: str, directory_fd: int, listed: os.stat_result) -> int:
        if listed.st_nlink > 1:
            log.warning(
                "%s: a file of uid %d with %d links is not handed to the build user",
                name,
                listed.st_uid,
                listed.st_nlink,
            )
            return 0
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory_fd
            )
        except (FileNotFoundError, OSError):
            return 0  # replaced meanwhile (by a link, say): not ours to follow
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != (listed.st_dev, listed.st_ino) or info.st_nlink > 1:
                return 0
            return self._own_open(fd, info)
        finally:
            os.close(fd)

    def _own_open(self, fd: int, info: os.stat_result | None = None) -> int:
        info = info or os.fstat(fd)
        if info.st_uid == self.uid:
            return 0
        os.fchown(fd, self.uid, self.gid)
        if info.st_mode & _SPECIAL:
            os.fchmod(fd, stat.S_IMODE(info.st_mode))  # Linux clears them on chown, even root's
        return 1

    def adopt(self, workspace: Path) -> None:
        """`workspace` handed over unless it is this user's already (one made before run_as was set)."""
        if workspace.stat().st_uid != self.uid:
            self.hand_over(workspace)

    def own(self, fd: int) -> None:
        """A file or directory the agent just made, open as `fd`, made this user's."""
        self._own_open(fd)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check(name: str) -> BuildUser:
    """The build user `name`, if this agent can run stages as it; else BuildUserProblem saying why."""
    user = BuildUser.named(name)
    if user.uid == 0:
        raise BuildUserProblem(
            f"{name!r} is uid 0: a stage run as it could read everything the agent holds; name an "
            "unprivileged user"
        )
    euid = os.geteuid()
    if user.uid == euid:
        raise BuildUserProblem(
            f"{name!r} is the user the agent runs as: its stages could read the agent's credentials, "
            "journal and config; name another user"
        )
    if euid != 0:
        raise BuildUserProblem(
            f"the agent runs as {user_name(euid)} (uid {euid}), and only root can start a stage as "
            f"{name!r}: run the agent as root "
            '(a LaunchDaemon: docs/agent.md, "A build user"), or remove run_as'
        )
    return user
