"""An attempt's artifact transfer, kept in memory by the upload and written on the stage record by
the lease keeper (relevo_agent.lease), so a slow write never slows an upload:

- the upload thread (and s3transfer's callbacks) only move counters under a lock held for an
  addition (`start`, `begin`, `sent`, `file_done`);
- each lease renewal carries the reading when one is due (`riding`): it changed since the last one
  written, and at least `interval_sec` has passed since then; never a write per callback;
- when the upload ends, `finish` writes the last reading (totals, or how far a failed one got),
  fenced on the attempt like every other agent write.

A renewal that would have to wait for `finish`'s write goes without the reading, so the lease
keeper never waits on it; a reading older than the final one is never written after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from botocore.exceptions import BotoCoreError, ClientError

from relevo_core.models.transfer import TransferProgress, TransferState
from relevo_core.store import stage_attempts

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_SEC = 2.0


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ProgressWriter:
    def __init__(
        self,
        ref: stage_attempts.StageRef,
        interval_sec: float = PROGRESS_INTERVAL_SEC,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.ref, self.interval_sec, self.clock, self.wall = ref, interval_sec, clock, wall
        self._counts = threading.Lock()  # held for an addition only: the upload's side
        self._writes = threading.Lock()  # held across a write: one reading on its way at a time
        self._state: TransferState | None = None
        self._files_total = self._bytes_total = self._files_done = self._bytes_done = 0
        self._current: str | None = None
        self._changes = 0  # counts every change, so a reading is written only when it is new
        self._written_changes = -1
        self._written_at: float | None = None
        self._ended = False

    # ---------------------------------------------------------------- the upload's side
    def start(self, files_total: int, bytes_total: int) -> None:
        with self._counts:
            self._state, self._files_total, self._bytes_total = (
                TransferState.UPLOADING,
                files_total,
                bytes_total,
            )
            self._changes += 1

    def begin(self, name: str) -> None:
        with self._counts:
            self._current = name
            self._changes += 1

    def sent(self, amount: int) -> None:
        """s3transfer's progress callback (a retried part comes back as a negative amount)."""
        with self._counts:
            self._bytes_done += amount
            self._changes += 1

    def file_done(self) -> None:
        with self._counts:
            self._files_done += 1
            self._current = None
            self._changes += 1

    def reading(self) -> TransferProgress | None:
        """The transfer as it stands; None before the upload started."""
        with self._counts:
            if self._state is None:
                return None
            return TransferProgress(
                attempt=self.ref.attempt,
                state=self._state,
                files_done=self._files_done,
                files_total=self._files_total,
                bytes_done=max(0, self._bytes_done),
                bytes_total=self._bytes_total,
                current_file=self._current,
                updated_at=self.wall().isoformat(),
            )

    def finish(self, succeeded: bool) -> None:
        """The upload ended: its last reading is written (fenced) whatever a renewal is doing.
        Raises LeaseLost when another attempt holds the stage; a write the network lost is only
        logged (the artifacts are stored and recorded: the reading is what the page shows)."""
        with self._counts:
            if self._state is None:
                return
            self._state = TransferState.UPLOADED if succeeded else TransferState.FAILED
            self._current = None
            self._changes += 1
        with self._writes:
            self._ended = True
            reading = self.reading()
            assert reading is not None
            try:
                stage_attempts.record_transfer(self.ref, reading)
            except (BotoCoreError, ClientError) as exc:
                log.warning(
                    "%s stage %d: the transfer's last reading was not written (%s)",
                    self.ref.job_id,
                    self.ref.stage_index,
                    exc,
                )

    def finish_quietly(self, succeeded: bool) -> None:
        """`finish` after the upload failed: the failure is what the stage reports, so a refused
        write of its last reading is only logged too."""
        try:
            self.finish(succeeded)
        except stage_attempts.LeaseLost as exc:
            log.warning(
                "%s stage %d: the transfer's last reading was refused (%s)",
                self.ref.job_id,
                self.ref.stage_index,
                exc,
            )

    # ---------------------------------------------------------------- the lease keeper's side
    @contextmanager
    def riding(self) -> Iterator[TransferProgress | None]:
        """The reading a lease renewal should carry (None: nothing due). It counts as written when
        the body returns; a body that raises leaves it due for the next renewal."""
        if not self._writes.acquire(blocking=False):
            yield None  # `finish` is writing: never wait on it
            return
        try:
            due = self._due()
            yield due[1] if due else None
            if due is not None:
                self._written_changes, self._written_at = due[0], self.clock()
        finally:
            self._writes.release()

    def _due(self) -> tuple[int, TransferProgress] | None:
        if self._ended:
            return None
        with self._counts:
            changes = self._changes
        if changes == self._written_changes:
            return None
        if self._written_at is not None and self.clock() - self._written_at < self.interval_sec:
            return None
        reading = self.reading()
        return None if reading is None else (changes, reading)
