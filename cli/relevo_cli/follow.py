"""`relevo job logs JOB [-f]`: print a job's output from a seq on, and with -f keep following it
until the job ends.

The follower keeps one number, the seq after the last chunk it printed, and only ever asks the
API for chunks from there (GET /jobs/{id}/logs?from_seq=). A dropped connection, a timeout, a
throttle or a 5xx is waited out with a capped exponential backoff and the same request is sent
again, so nothing is skipped and nothing printed twice. It stops when a page says the job is
terminal and no more chunks are stored (the status is read before the chunks), and reports the
job's outcome as an exit code.

What the job does besides printing (it waits at its gate, for an agent) is said only once the
output stored so far is printed, so it always comes after the lines that came before it.

`StageLog` labels each line with its stage and attempt and marks where each stage begins and
ends, from the stages' states the page carries (read before its chunks, like the status): a
chunk of the next stage is only printed once a page says the stage before it ended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

import requests

from relevo_cli.api import ApiError

# Exit codes of `relevo job logs -f`: the job's outcome.
OUTCOME_EXIT_CODES = {"succeeded": 0, "failed": 1, "canceled": 1}
ENDED_STAGE = frozenset({"succeeded", "warning", "failed", "skipped", "canceled"})


def is_transient(exc: BaseException) -> bool:
    """Worth sending the same request again: the network or the service, not the request."""
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return True
    return isinstance(exc, ApiError) and (exc.status >= 500 or exc.status == 429)


def _what_it_does(page: dict[str, Any]) -> tuple[Any, ...]:
    return (page["status"], page.get("waiting_stage"), page.get("queue_reason"), page.get("queue_detail"))


Owner = tuple[str, int]


class StageLog:
    """Lines as `stage#attempt | text`, with a marker line where a stage (or an attempt) begins
    and where it ends. `only`: the stages to show (the others' lines and markers are left out).
    A chunk may end inside a line: the rest of that line is waited for (and a line never joins
    the output of two attempts)."""

    def __init__(self, write: Callable[[str], None], only: Collection[str] | None = None) -> None:
        self._write = write
        self.only = set(only) if only else None
        self.current: Owner | None = None
        self.partial = ""
        # Stage attempts whose end was said (or that need none any more).
        self.closed: set[Owner] = set()

    # ------------------------------------------------------------------ what the page says
    @staticmethod
    def _stages(page: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {stage["name"]: stage for stage in page.get("stages") or []}

    @staticmethod
    def _ended(owner: Owner, stage: dict[str, Any] | None) -> bool:
        if stage is None:
            return True  # a page without stages cannot hold a chunk back
        return (stage.get("attempt") or 0) > owner[1] or stage["status"] in ENDED_STAGE

    # ------------------------------------------------------------------ output
    def _shown(self, stage: str) -> bool:
        return self.only is None or stage in self.only

    def _line(self, owner: Owner, text: str) -> None:
        if self._shown(owner[0]):
            self._write(f"{owner[0]}#{owner[1]} | {text}\n")

    def _marker(self, stage: str, words: str) -> None:
        if self._shown(stage):
            self._write(f"── {words} ──\n")

    def _flush(self) -> None:
        if self.current is not None and self.partial:
            self._line(self.current, self.partial)
        self.partial = ""

    def chunk(self, chunk: dict[str, Any], page: dict[str, Any]) -> bool:
        """Print a chunk; False (nothing printed) when the page cannot tell that the stage
        attempt printing before it has ended (read the page again)."""
        owner: Owner = (chunk.get("stage") or "?", int(chunk.get("attempt") or 0))
        if owner != self.current:
            stages = self._stages(page)
            if self.current is not None and self.current not in self.closed:
                if not self._ended(self.current, stages.get(self.current[0])):
                    return False
                self._close(self.current, stages.get(self.current[0]))
            self._close_silent_before(owner[0], stages)
            self.current = owner
            where = f" on {chunk['agent_id']}" if chunk.get("agent_id") else ""
            self._marker(owner[0], f"{owner[0]}{f', attempt {owner[1]},' if owner[1] > 1 else ''}{where}")
        *whole, self.partial = (self.partial + chunk["text"]).split("\n")
        for line in whole:
            self._line(owner, line)
        return True

    def _printing(self, name: str) -> bool:
        """An attempt of this stage printed and its end is not said yet."""
        return self.current is not None and self.current[0] == name and self.current not in self.closed

    def _close(self, owner: Owner, stage: dict[str, Any] | None) -> None:
        """The end of a stage attempt: its partial last line, then how it ended."""
        if owner == self.current:
            self._flush()
        self.closed.add(owner)
        self._marker(owner[0], end_words(owner, stage))

    def _close_silent_before(self, name: str, stages: dict[str, dict[str, Any]]) -> None:
        """Stages before `name` in the plan that ended without printing anything: said too, in order."""
        for stage in stages.values():
            if stage["name"] == name:
                return
            owner = (stage["name"], stage.get("attempt") or 0)
            if owner not in self.closed and stage["status"] in ENDED_STAGE and not self._printing(stage["name"]):
                self.closed.add(owner)
                self._marker(stage["name"], end_words(owner, stage))

    def settle(self, page: dict[str, Any], final: bool = False) -> None:
        """Everything stored is printed: say the ends the page knows of, in plan order (`final`:
        the job ended, so also a last line with no newline)."""
        stages = self._stages(page)
        if self.current is not None and self.current not in self.closed and self._ended(self.current, stages.get(self.current[0])):
            self._close(self.current, stages.get(self.current[0]))
        for stage in stages.values():
            owner = (stage["name"], stage.get("attempt") or 0)
            if stage["status"] not in ENDED_STAGE:
                break
            if owner not in self.closed and not self._printing(stage["name"]):
                self.closed.add(owner)
                self._marker(stage["name"], end_words(owner, stage))
        if final:
            self._flush()

    def give_up_waiting(self) -> None:
        """The page kept saying the stage attempt printing is not over although a later one
        printed: end it without its outcome."""
        if self.current is not None and self.current not in self.closed:
            self._flush()
            self.closed.add(self.current)
            self._marker(self.current[0], f"{self.current[0]}#{self.current[1]} ended")


def end_words(owner: Owner, stage: dict[str, Any] | None) -> str:
    """How a stage attempt ended, in a few words: `build succeeded on mac-1`, `test#1 failed on
    mac-2: Relevo.Transient.ExitCode, retried`, `lint warning: exit 3 (a warning exit code)`."""
    name, attempt = owner
    if stage is None:
        return f"{name}#{attempt} ended"
    if (stage.get("attempt") or 0) > attempt:
        failed = next((entry for entry in stage.get("failed_attempts") or [] if entry.get("attempt") == attempt), {})
        where = f" on {failed['agent']}" if failed.get("agent") else ""
        return f"{name}#{attempt} failed{where}: {failed.get('error') or 'no outcome'}, retried as attempt {stage['attempt']}"
    status = stage["status"]
    label = f"{name}#{attempt}" if attempt > 1 else name
    where = f" on {stage['agent_id']}" if stage.get("agent_id") else ""
    if status == "succeeded":
        return f"{label} succeeded{where}"
    if status == "warning":
        return f"{label} succeeded with warnings{where}: {stage.get('warning') or 'see the lines marked ::warning::'}"
    if status == "failed":
        exit_code = stage.get("exit_code")
        code = f"exit {exit_code}, " if exit_code not in (None, -1) else ""
        return f"{label} failed{where}: {code}{stage.get('error_class') or 'no cause recorded'}"
    if status == "skipped":
        return f"{name} skipped" + (f" (done by {stage['reused_from']})" if stage.get("reused_from") else "")
    return f"{label} {status}"


@dataclass
class LogFollower:
    """Prints chunks in seq order through `write` (through `render` when given: labelled by
    stage, with its boundaries); `fetch(from_seq)` is one GET .../logs page. `sleep` and `clock`
    are injected so the loop runs without real waits in tests."""

    fetch: Callable[[int], dict[str, Any]]
    write: Callable[[str], None]
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    warn: Callable[[str], None] = lambda _: None
    # Called, once the output stored so far is printed, with each page on which what the job does
    # (status, the gate it waits at, why it waits for an agent) differs from the one said before.
    status_changed: Callable[[dict[str, Any]], None] = lambda _page: None
    poll_sec: float = 0.5
    backoff_base_sec: float = 0.5
    backoff_max_sec: float = 15.0
    # Give up after failing without a break for this long (the last error is raised).
    give_up_after_sec: float = 600.0
    next_seq: int = 0
    status: str | None = None
    printed: int = 0
    failures: list[str] = field(default_factory=list)
    render: StageLog | None = None
    # Pages read again while a chunk of a later stage waits for the stage before it to be seen ended.
    hold_pages: int = 4
    _said: tuple[Any, ...] | None = None

    def backoff(self, failures: int) -> float:
        return min(self.backoff_max_sec, self.backoff_base_sec * 2 ** (failures - 1))

    def _page(self) -> dict[str, Any]:
        """One page from next_seq, retried through transient failures."""
        failing_since: float | None = None
        streak = 0
        while True:
            try:
                return self.fetch(self.next_seq)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                now = self.clock()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= self.give_up_after_sec:
                    raise
                streak += 1
                delay = self.backoff(streak)
                self.failures.append(type(exc).__name__)
                self.warn(f"log read failed ({exc}); resuming from seq {self.next_seq} in {delay:.1f}s")
                self.sleep(delay)

    def _print(self, page: dict[str, Any]) -> bool:
        """The page's chunks from next_seq on; False when the renderer held one back."""
        for chunk in page["chunks"]:
            if chunk["seq"] < self.next_seq:
                continue  # already printed (a page can only start later, never earlier: a guard)
            if self.render is None:
                self.write(chunk["text"])
            elif not self.render.chunk(chunk, page):
                return False
            self.printed += 1
            self.next_seq = chunk["seq"] + 1
        return True

    def run(self, follow: bool) -> int:
        """Print until the stored output ends (follow=False: exit 0) or, following, until the job
        ends: its outcome's exit code (0 succeeded, 1 failed or canceled)."""
        held = 0
        while True:
            started = self.clock()
            page = self._page()
            self.status = page["status"]
            if not self._print(page):
                held += 1
                if held > self.hold_pages:
                    assert self.render is not None
                    self.render.give_up_waiting()
                elif held > 1:
                    self.sleep(self.poll_sec)  # the first time, read again at once
                continue
            held = 0
            if page["more"]:
                continue
            ended = page["terminal"]
            if self.render is not None:
                self.render.settle(page, final=ended or not follow)
            if _what_it_does(page) != self._said:
                self._said = _what_it_does(page)
                self.status_changed(page)
            if not follow:
                return 0
            if ended:
                return OUTCOME_EXIT_CODES.get(page["status"], 1)
            # Every poll_sec, the read's own time included.
            self.sleep(max(0.0, self.poll_sec - (self.clock() - started)))
