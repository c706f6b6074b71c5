"""Disk hygiene between stages: workspace retention and each project's cleanup command.

Both run only while the agent is idle, on the poll thread, before it receives again: no stage
runs, none can start meanwhile, so a cleanup never runs during a stage and a workspace is never
removed under one. Retention (`keep_workspaces` N > 0) keeps the N workspaces used last and
removes older ones, except any a lease holds: a stage of this process, an attempt its journal
still has in flight (one a restart is reconciling), or a stage of another agent process on this
machine sharing the workspace root (the default `~/relevo/workspaces` is the user's, so two agents
of one Mac share it): every stage holds a shared lock on its workspace's lock file for its whole
run (WorkspaceLocks), and a workspace is removed only under that lock taken exclusively, without
waiting. The low-disk check itself is the presence's (relevo_agent.presence: below min_free_disk_gb
the agent claims nothing, reason agent_low_disk).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from relevo_agent.config import AgentConfig
from relevo_agent.journal import Journal
from relevo_agent.stage_env import as_build_user, stage_environment

log = logging.getLogger(__name__)

_USED_KEY = "workspace_used:"
# Beside the workspaces, a dot-directory retention never lists: a lock file outlives the workspace
# it guards, so a removal and a stage starting in it always meet on the same file.
_LOCKS_DIR = ".relevo-locks"


class WorkspaceLocks:
    """flock(2) locks on <workspace_root>/.relevo-locks/<workspace>.lock, shared between the agent
    processes of one machine: a stage holds its workspace's shared, a removal takes it exclusive
    without waiting. The kernel drops a process's locks when it dies, so a crashed agent holds none
    (its journal says what it left in flight)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _open(self, workspace: Path, suffix: str = "lock") -> int:
        directory = self.root / _LOCKS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        return os.open(directory / f"{workspace.name}.{suffix}", os.O_RDWR | os.O_CREAT, 0o600)

    @contextmanager
    def using(self, workspace: Path) -> Iterator[None]:
        """Held while a stage runs in `workspace` (waits for a removal under way to finish)."""
        fd = self._open(workspace)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    @contextmanager
    def occupying(self, workspace: Path) -> Iterator[bool]:
        """True while this stage is the only one, of any agent process of this machine, that runs
        in `workspace` (taken without waiting: False, someone else's stage runs there). flock(2)
        locks belong to the open file, so two stages of one process exclude each other too."""
        with self._exclusive(workspace, "occupied") as taken:
            yield taken

    @contextmanager
    def removing(self, workspace: Path) -> Iterator[bool]:
        """True while no stage of any process uses `workspace`, and none can start in it."""
        with self._exclusive(workspace, "lock") as taken:
            yield taken

    @contextmanager
    def _exclusive(self, workspace: Path, suffix: str) -> Iterator[bool]:
        fd = self._open(workspace, suffix)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)


class Hygiene:
    def __init__(
        self, config: AgentConfig, journal: Journal, running_workspaces: Callable[[], set[Path]]
    ) -> None:
        self.config = config
        self.journal = journal
        self._running_workspaces = running_workspaces
        self._lock = threading.Lock()
        # (project, command) to run once idle; one entry per workspace (a project's shards may
        # have used more than one).
        self._cleanups: dict[Path, tuple[str, str]] = {}
        self._prune_due = False
        self.locks = WorkspaceLocks(config.workspace_root)

    def used(self, workspace: Path) -> None:
        """A stage of this workspace starts: it is the most recently used."""
        self.journal.remember(_USED_KEY + workspace.name, datetime.now(UTC).isoformat())

    def stage_ended(self, project: str, workspace: Path, cleanup: str | None) -> None:
        with self._lock:
            if cleanup:
                self._cleanups[workspace] = (project, cleanup)
            self._prune_due = self.config.keep_workspaces > 0

    def held(self) -> set[Path]:
        """The workspaces a lease holds: this process's stages and the journal's in-flight attempts."""
        return set(self._running_workspaces()) | {Path(op.resource_key) for op in self.journal.in_flight()}

    def between_stages(self) -> None:
        """Run what is due (the poll thread calls this only while no stage runs)."""
        with self._lock:
            cleanups, self._cleanups = self._cleanups, {}
            prune, self._prune_due = self._prune_due, False
        for workspace, (project, command) in sorted(cleanups.items()):
            self._cleanup(project, command, workspace)
        if prune:
            self.prune()

    def _cleanup(self, project: str, command: str, workspace: Path) -> None:
        # The project's command, as a stage's: never the agent's credentials, as the build user if any.
        env = stage_environment(os.environ, {}, None)
        user = self.config.build_user
        spawn = user.popen() if user is not None else {}
        if user is not None:
            env = as_build_user(env, user)
        try:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=workspace if workspace.is_dir() else None,
                capture_output=True,
                text=True,
                timeout=self.config.cleanup_timeout_sec,
                check=False,
                start_new_session=True,
                env=env,
                **spawn,
            )
            log.info("cleanup of %s exited %d", project, done.returncode)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("cleanup of %s did not finish (%s)", project, exc)

    def prune(self) -> list[Path]:
        """Remove the workspaces beyond the `keep_workspaces` used last, never one a lease holds."""
        root = self.config.workspace_root
        if self.config.keep_workspaces <= 0 or not root.is_dir():
            return []
        workspaces = [path for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")]

        def last_used(path: Path) -> str:
            return (
                self.journal.recall(_USED_KEY + path.name)
                or datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat()
            )

        ordered = sorted(workspaces, key=last_used, reverse=True)
        held = {path.resolve() for path in self.held()}
        removed = []
        for path in ordered[self.config.keep_workspaces :]:
            if path.resolve() in held:
                log.info("workspace %s is beyond keep_workspaces but a lease holds it; kept", path)
                continue
            with self.locks.removing(path) as free:
                if not free:
                    log.info(
                        "workspace %s is beyond keep_workspaces but a stage of another agent uses it; kept",
                        path,
                    )
                    continue
                shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            log.info("removed workspace %s (keep_workspaces %d)", path, self.config.keep_workspaces)
        return removed
