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

`StageLog` labels each line with its stage and attempt (and its shard, for a stage with shards)
and marks where each stage begins and ends, from the stages' states the page carries (read before
its chunks, like the status): a chunk of the next stage is only printed once a page says the stage
before it ended. The shards of one stage print side by side, their lines interleaved.

A stage's begin line is printed once a page says its command runs (its claim: status `running`),
not with its first output, and its end line once a page says it ended, with how long it ran; a
stage that prints nothing for HEARTBEAT_SILENT_SEC gets a line saying it still runs, and again
after each further HEARTBEAT_SILENT_SEC of silence (`build#1 still running on mac-eu-1, 2m
silent`), so a quiet `xcodebuild -quiet` does not look hung. Silence is counted on the follower's
own clock, from the last output it printed of that stage (or its begin line).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import requests

from relevo_cli.api import ApiError
from relevo_cli.stage_ends import Owner, end_words, silence_words

# Exit codes of `relevo job logs -f`: the job's outcome.
OUTCOME_EXIT_CODES = {"succeeded": 0, "failed": 1, "canceled": 1}
# manual_review: its attempt decided (reconciled) without running; a person's resolution follows.
ENDED_STAGE = frozenset({"succeeded", "warning", "failed", "skipped", "canceled", "manual_review"})
# A stage attempt whose command runs (claimed): its begin line is printed then.
RUNNING_STAGE = "running"
# `relevo job logs -f` says a stage still runs after this long without output, and again after
# each further such stretch.
HEARTBEAT_SILENT_SEC = 60.0


def is_transient(exc: BaseException) -> bool:
    """Worth sending the same request again: the network or the service, not the request."""
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return True
    return isinstance(exc, ApiError) and (exc.status >= 500 or exc.status == 429)


def _what_it_does(page: dict[str, Any]) -> tuple[Any, ...]:
    return (page["status"], page.get("waiting_stage"), page.get("queue_reason"), page.get("queue_detail"))


def _key(owner: Owner) -> tuple[str, int, int]:
    """Shard order, then attempt order."""
    return (owner[0], -1 if owner[2] is None else owner[2], owner[1])


class StageLog:
    """Lines as `stage#attempt | text` (a shard's as `stage[label]#attempt | text`, its label its
    index or its matrix combination), with a marker line where a stage (or an attempt, or a
    shard) begins and where it ends. `only`: the stages to show; `shards`: the shards to show, by
    index (the others' lines and markers are left out; a stage's own markers too). A chunk may
    end inside a line: the rest of that line is waited for, and a line never joins the output of
    two attempts or two shards.

    The shards of a stage run side by side, so their chunks interleave and are printed as they
    come; the output of a later stage waits until the page says the one before it ended."""

    def __init__(
        self,
        write: Callable[[str], None],
        only: Collection[str] | None = None,
        shards: Collection[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        silent_sec: float = HEARTBEAT_SILENT_SEC,
    ) -> None:
        self._write = write
        self.clock = clock
        self.silent_sec = silent_sec
        self.only = set(only) if only else None
        self.shards = set(shards) if shards is not None else None
        self.current: Owner | None = None
        # Each owner's last line while its chunk did not end it with a newline.
        self.partials: dict[Owner, str] = {}
        # Owners whose output began, and those whose end was said (or that need none any more).
        self.opened: set[Owner] = set()
        self.closed: set[Owner] = set()
        # Shard labels by (stage, shard index), from the pages' stages.
        self.labels: dict[tuple[str, int], str] = {}
        # Each open owner's last output (or begin line) on `clock`, and the heartbeats said since.
        self.heard: dict[Owner, float] = {}
        self.beats: dict[Owner, int] = {}
        # When each owner's attempt started, as a page said while it ran: a retried attempt's
        # record is the retry's by the time its end is said.
        self.started: dict[Owner, str] = {}

    # ------------------------------------------------------------------ what the page says
    def _stages(self, page: dict[str, Any]) -> dict[str, dict[str, Any]]:
        stages = {stage["name"]: stage for stage in page.get("stages") or []}
        for stage in stages.values():
            for shard in stage.get("shards") or []:
                self.labels[(stage["name"], shard["shard"])] = shard["label"]
        return stages

    @staticmethod
    def _mark(owner: Owner, stages: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
        """What the page says of the owner: its stage's marks, or its shard's."""
        stage = stages.get(owner[0])
        if stage is None or owner[2] is None:
            return stage
        return next((shard for shard in stage.get("shards") or [] if shard["shard"] == owner[2]), None)

    def _ended(self, owner: Owner, stages: dict[str, dict[str, Any]]) -> bool:
        mark = self._mark(owner, stages)
        if mark is None:
            return True  # a page without stages cannot hold a chunk back
        return (mark.get("attempt") or 0) > owner[1] or mark["status"] in ENDED_STAGE

    def name(self, owner: Owner) -> str:
        """`test`, or for a shard `test[2]` / `test[device=iPhone 16, os=18.2]`."""
        stage, _, shard = owner
        return stage if shard is None else f"{stage}[{self.labels.get((stage, shard), shard)}]"

    # ------------------------------------------------------------------ output
    def _shown(self, owner: Owner) -> bool:
        return (self.only is None or owner[0] in self.only) and (
            self.shards is None or owner[2] in self.shards
        )

    def _line(self, owner: Owner, text: str) -> None:
        if self._shown(owner):
            self._write(f"{self.name(owner)}#{owner[1]} | {text}\n")

    def _marker(self, owner: Owner, words: str, kind: str = "begin") -> None:
        """A boundary line: `kind` begin, end or beat (a stage silent for a while still runs)."""
        if self._shown(owner):
            self._write(f"── {words} ──\n")

    def _begin(self, owner: Owner, agent_id: str | None, started_at: str | None = None) -> None:
        """The line where a stage attempt (or a shard's) begins."""
        self.opened.add(owner)
        self.heard[owner] = self.clock()
        if started_at:
            self.started[owner] = started_at
        where = f" on {agent_id}" if agent_id else ""
        self._marker(owner, f"{self.name(owner)}{f', attempt {owner[1]},' if owner[1] > 1 else ''}{where}")

    def _flush(self, owner: Owner) -> None:
        partial = self.partials.pop(owner, "")
        if partial:
            self._line(owner, partial)

    def _open(self) -> list[Owner]:
        return sorted(self.opened - self.closed, key=_key)

    def chunk(self, chunk: dict[str, Any], page: dict[str, Any]) -> bool:
        """Print a chunk; False (nothing printed) when the page cannot tell that the stage
        attempt printing before it has ended (read the page again)."""
        owner: Owner = (chunk.get("stage") or "?", int(chunk.get("attempt") or 0), chunk.get("shard"))
        if owner != self.current:
            stages = self._stages(page)
            before = self.current
            # Shards of one stage run side by side: their output interleaves. Anything else
            # follows the end of what printed before it.
            siblings = (
                before is not None
                and before[0] == owner[0]
                and before[2] is not None
                and owner[2] is not None
            )
            if before is not None and before not in self.closed and not siblings:
                if not self._ended(before, stages):
                    return False
                self._close_stage(before[0], stages, before)
            self._close_silent_before(owner[0], stages)
            if owner not in self.opened:
                # An earlier attempt of the same shard ended (failed, retried) when this one began.
                for earlier in self._open():
                    if earlier[0] == owner[0] and earlier[2] == owner[2] and earlier[1] < owner[1]:
                        self._close(earlier, stages)
                mark = self._mark(owner, stages) or {}
                self._begin(
                    owner,
                    chunk.get("agent_id"),
                    mark.get("started_at") if mark.get("attempt") == owner[1] else None,
                )
            self.current = owner
        self.heard[owner], self.beats[owner] = self.clock(), 0
        *whole, rest = (self.partials.pop(owner, "") + chunk["text"]).split("\n")
        if rest:
            self.partials[owner] = rest
        for line in whole:
            self._line(owner, line)
        return True

    def _printing(self, name: str) -> bool:
        """An attempt (or a shard) of this stage printed and its end is not said yet."""
        return any(owner[0] == name for owner in self._open())

    def _close(self, owner: Owner, stages: dict[str, dict[str, Any]]) -> None:
        """The end of a stage attempt (or a shard's): its partial last line, then how it ended."""
        self._flush(owner)
        self.closed.add(owner)
        self._marker(
            owner,
            end_words(owner, self._mark(owner, stages), self.name(owner), self.started.get(owner)),
            "end",
        )

    def _close_stage(self, name: str, stages: dict[str, dict[str, Any]], owner: Owner) -> None:
        """`owner` ended: for a shard, its stage did, so every shard of it still open ends, then
        the stage itself."""
        if owner[2] is None:
            self._close(owner, stages)
            return
        for shard in [open_ for open_ in self._open() if open_[0] == name]:
            self._close(shard, stages)
        self._close_whole(name, stages)

    def _close_whole(self, name: str, stages: dict[str, dict[str, Any]]) -> None:
        """The end of a stage as a whole (a stage with shards, once its shards' ends are said)."""
        stage = stages.get(name)
        whole: Owner = (name, (stage or {}).get("attempt") or 0, None)
        if whole not in self.closed:
            self.closed.add(whole)
            self._marker(whole, end_words(whole, stage, name), "end")

    def _close_silent_before(self, name: str, stages: dict[str, dict[str, Any]]) -> None:
        """Stages before `name` in the plan that ended without printing anything: said too, in order."""
        for stage in stages.values():
            if stage["name"] == name:
                return
            if stage["status"] in ENDED_STAGE and not self._printing(stage["name"]):
                self._close_whole(stage["name"], stages)

    def settle(self, page: dict[str, Any], final: bool = False) -> None:
        """Everything stored is printed: say the ends the page knows of, in plan order (`final`:
        the job ended, so also the last lines with no newline)."""
        stages = self._stages(page)
        for owner in self._open():
            if self._ended(owner, stages):
                self._close(owner, stages)
        for stage in stages.values():
            if stage["status"] not in ENDED_STAGE:
                break
            if not self._printing(stage["name"]):
                self._close_whole(stage["name"], stages)
        if final:
            for owner in sorted(self.partials, key=_key):
                self._flush(owner)
        self._begin_running(stages)

    def _begin_running(self, stages: dict[str, dict[str, Any]]) -> None:
        """The begin line of each stage attempt (or shard) whose command the page says runs and
        that printed nothing yet, in plan order (then shard order): said when it starts, not with
        its first output. An earlier attempt of the same stage (or shard) still open ends first."""
        for stage in stages.values():
            runs = (
                [(stage, None)]
                if not stage.get("shards")
                else [(shard, shard["shard"]) for shard in stage["shards"]]
            )
            for mark, shard in runs:
                if mark["status"] != RUNNING_STAGE or not mark.get("attempt"):
                    continue
                owner: Owner = (stage["name"], int(mark["attempt"]), shard)
                if mark.get("started_at") and owner not in self.started:
                    self.started[owner] = mark["started_at"]
                if owner in self.opened:
                    continue
                for earlier in self._open():
                    if earlier[0] == owner[0] and earlier[2] == owner[2] and earlier[1] < owner[1]:
                        self._close(earlier, stages)
                self._begin(owner, mark.get("agent_id"), mark.get("started_at"))
                self.current = owner

    def beat(self, page: dict[str, Any]) -> None:
        """While following: for each stage attempt (or shard) the page says still runs, a line
        each HEARTBEAT_SILENT_SEC it printed nothing (`build#1 still running on mac-eu-1, 2m silent`)."""
        stages = self._stages(page)
        now = self.clock()
        for owner in self._open():
            mark = self._mark(owner, stages)
            if mark is None or mark["status"] != RUNNING_STAGE or (mark.get("attempt") or 0) != owner[1]:
                continue
            silent = now - self.heard.setdefault(owner, now)
            if silent < self.silent_sec * (self.beats.get(owner, 0) + 1):
                continue
            self.beats[owner] = self.beats.get(owner, 0) + 1
            where = f" on {mark['agent_id']}" if mark.get("agent_id") else ""
            self._marker(
                owner,
                f"{self.name(owner)}#{owner[1]} still running{where}, {silence_words(silent)} silent",
                "beat",
            )

    def give_up_waiting(self) -> None:
        """The page kept saying the stage attempt printing is not over although a later one
        printed: end it (and its open siblings, for a shard) without its outcome."""
        if self.current is None or self.current in self.closed:
            return
        ending = (
            [owner for owner in self._open() if owner[0] == self.current[0]]
            if self.current[2] is not None
            else [self.current]
        )
        for owner in ending:
            self._flush(owner)
            self.closed.add(owner)
            self._marker(owner, f"{self.name(owner)}#{owner[1]} ended", "end")


@dataclass
class LogFollower:
    """Prints chunks in the log's order through `write` (through `render` when given: labelled by
    stage, with its boundaries); `fetch(cursor)` is one GET .../logs page from that cursor (the
    API's from_seq: a seq, or for a job with shards the place in each shard's log, relevo_core.jobs.logs).
    `sleep` and `clock`
    are injected so the loop runs without real waits in tests."""

    fetch: Callable[[int | str], dict[str, Any]]
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
    next_seq: int | str = 0
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
            # A page starts at the cursor asked for: each chunk after it, each once. A chunk's
            # `next` is the cursor after it (an older API's pages have seqs only).
            following = chunk.get("next", chunk["seq"] + 1)
            if "next" not in chunk and chunk["seq"] < int(self.next_seq):
                continue  # already printed (a page can only start later, never earlier: a guard)
            if self.render is None:
                self.write(chunk["text"])
            elif not self.render.chunk(chunk, page):
                return False
            self.printed += 1
            self.next_seq = following
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
            if self.render is not None:
                self.render.beat(page)
            # Every poll_sec, the read's own time included.
            self.sleep(max(0.0, self.poll_sec - (self.clock() - started)))
