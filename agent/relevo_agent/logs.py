"""Ship a stage's output to the job's log: masked first, then chunked in order by a background
thread, so a command printing fast never waits for the network.

Masking happens in the executor's reader thread, before the text is buffered anywhere: the values
of the configured environment variables become `******`, including a value split across two reads.
The buffer is bounded in memory; past the bound, masked text spills to a private temp file (order
kept) rather than blocking the command or dropping output.
"""

from __future__ import annotations

import codecs
import logging
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from relevo_agent.config import AgentConfig
from relevo_core.aws import in_this_context
from relevo_core.store.log_chunks import MAX_INLINE_CHUNK_BYTES, ChunkWriter
from relevo_core.store.stage_attempts import LeaseLost, StageRef

log = logging.getLogger("relevo_agent.logs")

MASK = "******"


def secret_values(names: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """The values to mask: those of the named variables that are set and not empty."""
    return [env[name] for name in names if env.get(name)]


class Masker:
    """Replaces secret values in a stream of text, across the boundaries of the pieces fed to it.

    It holds back the last (longest secret - 1) characters of what it has seen, since they may
    be the start of a secret that the next piece completes; `flush` releases them at the end.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first, so a secret containing another is replaced whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._hold = max((len(s) for s in self._secrets), default=1) - 1
        self._pending = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def mask(self, text: str) -> str:
        """One whole piece of text, masked (no state kept)."""
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return text

    def feed(self, data: bytes) -> str:
        """Masked text that is safe to release now (possibly empty)."""
        text = self._pending + self._decoder.decode(data)
        if not self._secrets:
            self._pending = ""
            return text
        text = self.mask(text)
        if self._hold == 0:
            self._pending = ""
            return text
        cut = max(0, len(text) - self._hold)
        self._pending = text[cut:]
        return text[:cut]

    def flush(self) -> str:
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return self.mask(text)

    def mask_tail(self, text: str, limit: int, cut: bool = False) -> str:
        """The last `limit` characters of `text`, masked, for a record that keeps only a tail
        (reconcile evidence, receipts).

        The whole text is masked before it is shortened, so shortening never splits a secret.
        When `text` is itself the end of something longer (`cut`), it may begin with the end of a
        secret, which no longer matches: its first (longest secret - 1) characters become MASK.
        """
        tail = self.mask(text)[-limit:]
        if cut and self._hold:
            tail = MASK + tail[self._hold :]
        return tail


class ChunkSink(Protocol):
    def append_many(self, texts: list[str], now: datetime) -> list[int]: ...


@dataclass
class ShipStats:
    chunks: int = 0
    chars: int = 0
    spilled_chars: int = 0
    retries: int = 0
    fenced: bool = False
    first_seq: int | None = None
    last_seq: int | None = None


def _cut(data: bytes, limit: int) -> bytes:
    """At most `limit` bytes of UTF-8 text, never ending inside a character."""
    if len(data) <= limit:
        return data
    end = limit
    while end > 0 and data[end] & 0xC0 == 0x80:  # a continuation byte: back up to its lead byte
        end -= 1
    return data[:end]


class _Spool:
    """Masked text past the in-memory bound, UTF-8 in a private temp file, read back in order."""

    def __init__(self, directory: str | None) -> None:
        fd, self.path = tempfile.mkstemp(prefix="relevo-log-", suffix=".spool", dir=directory)
        os.chmod(self.path, 0o600)
        self._file = os.fdopen(fd, "w+b")
        self._read_at = 0
        self._write_at = 0

    @property
    def empty(self) -> bool:
        return self._read_at >= self._write_at

    def write(self, text: str) -> None:
        self._file.seek(self._write_at)
        self._file.write(text.encode())
        self._write_at = self._file.tell()

    def read(self, max_bytes: int) -> bytes:
        self._file.flush()
        self._file.seek(self._read_at)
        data = _cut(self._file.read(max_bytes + 3), max_bytes)
        self._read_at += len(data)
        return data

    def close(self) -> None:
        self._file.close()
        os.unlink(self.path)


class LogShipper:
    """`write` is the executor's on_output; `line` adds the agent's own lines (upload progress);
    `close` flushes, waits for the backlog to be stored and returns what was shipped."""

    def __init__(
        self,
        sink: ChunkSink,
        masker: Masker,
        *,
        max_chunk_bytes: int = MAX_INLINE_CHUNK_BYTES,
        max_chunks_at_once: int = 8,
        max_buffer_chars: int = 8 * 1024 * 1024,
        flush_interval_sec: float = 0.2,
        retry_sec: float = 1.0,
        spool_dir: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.sink = sink
        self.masker = masker
        self.max_chunk_bytes = max_chunk_bytes
        # A backlog of several full chunks is stored in one go (their bodies side by side, their
        # index items in one transaction): what keeps up with a command printing fast.
        self.max_chunks_at_once = max_chunks_at_once
        self.max_buffer_chars = max_buffer_chars
        self.flush_interval_sec = flush_interval_sec
        self.retry_sec = retry_sec
        self.spool_dir = spool_dir
        self.clock = clock
        self.stats = ShipStats()
        self._memory: deque[str] = deque()
        self._memory_chars = 0
        self._spool: _Spool | None = None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._thread = threading.Thread(
            target=in_this_context(self._ship_loop), name="log-shipper", daemon=True
        )

    # ------------------------------------------------------------------ producer side
    def start(self) -> LogShipper:
        self._thread.start()
        return self

    def write(self, data: bytes) -> None:
        self._enqueue(self.masker.feed(data))

    def line(self, text: str) -> None:
        """One line of the agent's own, masked like the command's output."""
        self._enqueue(self.masker.feed((text.rstrip("\n") + "\n").encode()))

    def _enqueue(self, text: str) -> None:
        if not text:
            return
        with self._wake:
            if self.stats.fenced:
                return  # another attempt owns the log now; nothing more is stored for this one
            if self._spool is None and self._memory_chars + len(text) <= self.max_buffer_chars:
                self._memory.append(text)
                self._memory_chars += len(text)
            else:
                if self._spool is None:
                    self._spool = _Spool(self.spool_dir)
                self._spool.write(text)
                self.stats.spilled_chars += len(text)
            if self._memory_chars >= self.max_chunk_bytes or self._spool is not None:
                self._wake.notify()

    # ------------------------------------------------------------------ shipper thread
    def _take(self) -> str:
        """Up to one chunk (max_chunk_bytes of UTF-8) of buffered text, memory first, then the
        spool (order is kept because nothing goes to memory while the spool holds text). Called
        with the lock held."""
        parts: list[bytes] = []
        size = 0
        while self._memory and size < self.max_chunk_bytes:
            piece = self._memory.popleft()
            self._memory_chars -= len(piece)
            data = piece.encode()
            head = _cut(data, self.max_chunk_bytes - size)
            if len(head) < len(data):
                rest = data[len(head) :].decode()
                self._memory.appendleft(rest)
                self._memory_chars += len(rest)
            if not head:
                break
            parts.append(head)
            size += len(head)
        if not self._memory and self._spool is not None and size < self.max_chunk_bytes:
            parts.append(self._spool.read(self.max_chunk_bytes - size))
            if self._spool.empty:
                self._spool.close()
                self._spool = None
        return b"".join(parts).decode()

    def _take_many(self) -> list[str]:
        """What is buffered, as chunks: one (however small), and more while full ones are there.
        Called with the lock held."""
        texts = [self._take()] if self._memory or self._spool is not None else []
        while len(texts) < self.max_chunks_at_once and (
            self._memory_chars >= self.max_chunk_bytes or self._spool is not None
        ):
            texts.append(self._take())
        return [text for text in texts if text]

    def _ship_loop(self) -> None:
        while True:
            with self._wake:
                if self._memory_chars < self.max_chunk_bytes and self._spool is None and not self._closing:
                    self._wake.wait(self.flush_interval_sec)
                texts = self._take_many()
                closing = self._closing
            if texts:
                self._store(texts)
            elif closing:
                return

    def _store(self, texts: list[str]) -> None:
        while True:
            try:
                seqs = self.sink.append_many(texts, self.clock())
            except LeaseLost:
                log.warning("log shipping stopped: the attempt is no longer held")
                with self._wake:
                    self.stats.fenced = True
                    self._memory.clear()
                    self._memory_chars = 0
                    if self._spool is not None:
                        self._spool.close()
                        self._spool = None
                return
            except Exception as exc:  # network down, throttled: keep the text and try again
                self.stats.retries += 1
                log.warning("log chunk not stored (%s); retrying", exc)
                time.sleep(self.retry_sec)
                continue
            self.stats.chunks += len(texts)
            self.stats.chars += sum(len(text) for text in texts)
            if self.stats.first_seq is None:
                self.stats.first_seq = seqs[0]
            self.stats.last_seq = seqs[-1]
            return

    def close(self, timeout_sec: float | None = 60) -> ShipStats:
        self._enqueue(self.masker.flush())
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout_sec)
        if self._thread.is_alive():
            log.warning(
                "log shipping still busy after %.0fs; the rest of the output is not stored", timeout_sec or 0
            )
        return self.stats


def start_shipper(
    ref: StageRef,
    stage: str,
    config: AgentConfig,
    env: Mapping[str, str],
    expires_at: int,
    artifact_uri: str | None = None,
) -> LogShipper:
    """A running shipper for one stage attempt, masking the values of the configured variables;
    its chunks carry `expires_at` (epoch seconds) as their TTL, and large ones' bodies go under
    the job's `artifact_uri` (store/log_bodies)."""
    writer = ChunkWriter(ref, stage, expires_at, artifact_uri)
    return LogShipper(
        writer,
        Masker(secret_values(config.mask, env)),
        max_chunk_bytes=writer.max_chunk_bytes,
        flush_interval_sec=config.log_flush_interval_sec,
    ).start()
