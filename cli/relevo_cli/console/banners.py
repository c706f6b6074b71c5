"""Where each stage attempt's output ends, on the job page: the banner `relevo job logs` prints
(`── build succeeded on mac-1 after 8s ──`, relevo_cli.stage_ends.end_words), placed as the CLI places
it, by the same StageLog, from the stage marks each log page carries (read before its chunks).

The page marks where a stage's output begins itself (a label on its first line); what it cannot
know is where a stage ended, how and after how long. So the initial tail's chunks and the
stream's carry `marks`: the banners to show before the chunk's text; the banners the end of a
read says (the last stage ended, the job ended) go after it. Each banner has an `id` naming its
stage attempt (or shard, or the stage as a whole), and the page shows an id once: a stream that
resumes says again the ends it cannot know were said, and the page leaves them out.
"""

from __future__ import annotations

from typing import Any

from relevo_cli.follow import Owner, StageLog

# A chunk whose stage's predecessor the page does not yet say ended is read again this many times
# before that predecessor's end is said without its outcome (relevo_cli.follow.LogFollower's).
HOLD_PAGES = 4


def banner_id(owner: Owner) -> str:
    stage, attempt, shard = owner
    return f"end:{stage}:{'' if shard is None else shard}:{attempt}"


class Banners(StageLog):
    """StageLog with its lines left to the page and its end markers collected as banners."""

    def __init__(self) -> None:
        super().__init__(lambda _text: None)
        self.said: list[dict[str, str]] = []
        self.holds = 0

    def _line(self, owner: Owner, text: str) -> None:
        return  # the page shows the lines itself

    def _marker(self, owner: Owner, words: str, kind: str = "begin") -> None:
        if kind == "end":
            self.said.append({"id": banner_id(owner), "text": words})

    def _taken(self, since: int) -> list[dict[str, str]]:
        return self.said[since:]

    def place(self, page: dict[str, Any], held: str = "wait") -> tuple[list[dict[str, Any]], bool]:
        """The page's chunks, each with the banners that come before it (`marks`), up to one the
        page cannot place yet (its stage's predecessor not said to have ended): (chunks, held?).
        `held`: what to do with such a chunk: `wait` (stop there: read the page again), `end`
        (place it, its predecessor ended without its outcome, as after HOLD_PAGES reads), `skip`
        (place it, its predecessor's end left to a later read). A page without stage marks (an
        older API) gets no banners."""
        if "stages" not in page:
            return list(page["chunks"]), False
        placed: list[dict[str, Any]] = []
        for chunk in page["chunks"]:
            since = len(self.said)
            if not self.chunk(chunk, page):
                if held == "wait":
                    return placed, True
                if held == "end":
                    self.give_up_waiting()
                else:
                    self.current = None
                self.chunk(chunk, page)
            placed.append({**chunk, "marks": self._taken(since)})
        return placed, False

    def ends(self, page: dict[str, Any], final: bool) -> list[dict[str, str]]:
        """The banners a read that reached the end of the stored log says: the ends the page
        knows of (`final`: the job ended)."""
        if "stages" not in page:
            return []
        since = len(self.said)
        self.settle(page, final=final)
        return self._taken(since)


def tail_with_banners(
    chunks: list[dict[str, Any]], job: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The job page's first lines with their banners, from the job view's stages (read before the
    log): (the chunks with their `marks`, the banners after the last one)."""
    from relevo_core.jobs.logs import stage_marks

    page = {"stages": [stage_marks(stage) for stage in job["stages"]], "chunks": chunks}
    banners = Banners()
    # The job was read before its log: a chunk of a stage whose predecessor it does not say ended
    # is shown without that end, which the stream says once it knows it.
    placed, _ = banners.place(page, held="skip")
    return placed, banners.ends(page, final=False)
