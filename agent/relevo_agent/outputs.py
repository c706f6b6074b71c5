"""A stage's values: what its command appends to $RELEVO_OUTPUT, read while it runs.

The syntax is GitHub Actions' for `$GITHUB_OUTPUT`:

    version=1.4.2
    notes<<EOF
    first line
    second line
    EOF

A value is journaled and recorded on the stage record (fenced on the attempt) as soon as its line
is complete, not only when the command ends: a notarization stage that records its submission id
right after `notarytool submit --no-wait` has it on record even if its Mac dies a second later,
and a reconcile's effect probe gets it as RELEVO_PREVIOUS_OUT_<KEY>. Later stages get every value
as RELEVO_OUT_<STAGE>_<KEY> (relevo_core.models.handoff). The same key written again keeps the
last value. A value that holds one of the agent's `mask` secrets is withheld: never journaled,
recorded or handed on (the log says so).

A line that is neither form, a heredoc left open when the command ends, or more than
MAX_OUTPUT_KEYS keys or MAX_OUTPUT_BYTES fails the stage with Relevo.Fatal.Output.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from relevo_agent.build_user import BuildUser
from relevo_core.aws import in_this_context
from relevo_core.models.handoff import MAX_OUTPUT_BYTES, MAX_OUTPUT_KEYS, output_key_problem, outputs_size

log = logging.getLogger(__name__)

_HEREDOC = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]{0,63})<<([A-Za-z0-9_.-]{1,64})$")
READ_INTERVAL_SEC = 0.2


class OutputInvalid(Exception):
    """What the command wrote cannot be read, or is over a limit: the stage fails Relevo.Fatal.Output."""


class OutputParser:
    """Reads the file's bytes as they come; `values` holds every complete entry so far."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.values: dict[str, str] = {}
        self.withheld: list[str] = []
        self._secrets = [secret for secret in secrets if secret]
        self._pending = b""
        self._line = 0
        # An open heredoc: (key, delimiter, its lines so far, the line it opened on).
        self._open: tuple[str, str, list[str], int] | None = None

    def feed(self, data: bytes) -> list[str]:
        """The keys a complete entry of `data` set (in order)."""
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        changed: list[str] = []
        for raw in lines:
            self._take(raw, changed)
        return changed

    def finish(self) -> list[str]:
        """The command ended: a last line without its newline counts; an open heredoc is an error."""
        changed: list[str] = []
        if self._pending:
            rest, self._pending = self._pending, b""
            self._take(rest, changed)
        if self._open is not None:
            key, delimiter, _, opened = self._open
            raise OutputInvalid(
                f"$RELEVO_OUTPUT line {opened}: the value of {key!r} (<<{delimiter}) never ends: no line "
                f"{delimiter!r} follows"
            )
        return changed

    def _take(self, raw: bytes, changed: list[str]) -> None:
        self._line += 1
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise OutputInvalid(f"$RELEVO_OUTPUT line {self._line} is not UTF-8 text") from None
        if line.endswith("\r"):
            line = line[:-1]
        if self._open is not None:
            key, delimiter, lines, opened = self._open
            if line == delimiter:
                self._open = None
                self._set(key, "\n".join(lines), changed)
            else:
                lines.append(line)
            return
        if not line.strip():
            return
        heredoc = _HEREDOC.match(line)
        if heredoc:
            self._open = (heredoc.group(1), heredoc.group(2), [], self._line)
            return
        key, equals, value = line.partition("=")
        if not equals:
            raise OutputInvalid(
                f"$RELEVO_OUTPUT line {self._line}: {line[:80]!r} is neither key=value nor key<<DELIMITER"
            )
        problem = output_key_problem(key)
        if problem:
            raise OutputInvalid(f"$RELEVO_OUTPUT line {self._line}: {problem}")
        self._set(key, value, changed)

    def _set(self, key: str, value: str, changed: list[str]) -> None:
        if any(secret in value for secret in self._secrets):
            if key not in self.withheld:
                self.withheld.append(key)
            self.values.pop(key, None)
            return
        candidate = {**self.values, key: value}
        if len(candidate) > MAX_OUTPUT_KEYS:
            raise OutputInvalid(
                f"$RELEVO_OUTPUT line {self._line}: {key!r} would be the stage's value number "
                f"{len(candidate)}; at most {MAX_OUTPUT_KEYS}"
            )
        if outputs_size(candidate) > MAX_OUTPUT_BYTES:
            raise OutputInvalid(
                f"$RELEVO_OUTPUT line {self._line}: {key!r} would bring the stage's values to "
                f"{outputs_size(candidate)} bytes; "
                f"at most {MAX_OUTPUT_BYTES} (keep large data in a handoff file and pass its path)"
            )
        self.values = candidate
        changed.append(key)


@dataclass
class OutputWatch:
    """$RELEVO_OUTPUT of one attempt, read every READ_INTERVAL_SEC on a thread of its own while the
    command runs. Each change is handed to `on_change` (journal, then the fenced record), never
    from the command's path: a slow record never slows the command."""

    path: Path
    parser: OutputParser
    on_change: Callable[[dict[str, str], list[str]], None]
    interval_sec: float = READ_INTERVAL_SEC
    error: OutputInvalid | None = None
    _offset: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def create(
        cls,
        path: Path,
        secrets: Iterable[str],
        on_change: Callable[[dict[str, str], list[str]], None],
        owner: BuildUser | None = None,
    ) -> OutputWatch:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if owner is not None:
            # The build user reaches its own file but lists, creates and replaces nothing here: what
            # the agent reads back is the file it made, never a link the build put in its place.
            os.chmod(path.parent, 0o711)
        # The stage's own file: empty, readable and writable by the stage's user only.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            if owner is not None:
                owner.own(fd)
        finally:
            os.close(fd)
        return cls(path, OutputParser(secrets), on_change)

    def start(self) -> None:
        self._thread = threading.Thread(target=in_this_context(self._loop), name="outputs", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_sec):
            self._read(final=False)

    def _read(self, final: bool) -> None:
        if self.error is not None:
            return
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            data = b""  # removed by the command: nothing more to read
        self._offset += len(data)
        try:
            changed = self.parser.feed(data)
            if final:
                changed += self.parser.finish()
        except OutputInvalid as exc:
            self.error = exc
            return
        if changed:
            try:
                self.on_change(dict(self.parser.values), changed)
            except Exception:  # a record that failed is tried again with the next change, or at the end
                log.warning("%s: recording the stage's values failed", self.path, exc_info=True)

    def stop(self) -> dict[str, str]:
        """The command ended: the last bytes read, the values as they stand (raises OutputInvalid)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._read(final=True)
        if self.error is not None:
            raise self.error
        return dict(self.parser.values)
