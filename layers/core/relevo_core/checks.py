"""One thing a diagnosis checked, as every one of them tells it (`relevo-agent doctor`, `relevo
stack preflight`, `relevo stack show`): its name, a verdict, and the words that say what was
found and, when something is wrong, what to do."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Verdict(str, Enum):
    OK = "ok"
    WARN = "warn"  # ok, but worth fixing: said, and the check still passes
    FAIL = "FAIL"  # what runs now cannot work until it is fixed (the agent, a deployed stack)
    FIX = "FIX"  # what is about to run (a deploy) would fail until it is fixed
    UNKNOWN = "??"  # could not be checked


@dataclass(frozen=True)
class Check:
    name: str
    verdict: Verdict
    words: str

    @property
    def ok(self) -> bool:
        return self.verdict not in (Verdict.FAIL, Verdict.FIX)

    def line(self) -> str:
        return f"{self.verdict.value:<4}  {self.name}: {self.words}"
