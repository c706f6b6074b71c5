"""An EffectContext (relevo_agent.effects.kind) for a kind's tests: what it records and logs kept
in lists, its secrets from a dict, its clock injected (`wait` advances it: no real sleep)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relevo_agent.effects.kind import EffectContext, Endpoints


@dataclass
class EffectRecorder:
    """What a kind did with its context: `recorded` each record call's values in order, `lines`
    its log lines, `waits` the seconds it waited; `clock` the injected time (seconds)."""

    recorded: list[dict[str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    clock: float = 1_800_000_000.0
    time_left_sec: float = 3600.0
    stop: threading.Event = field(default_factory=threading.Event)

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.clock += seconds
        self.time_left_sec -= seconds
        return self.stop.is_set()

    @property
    def values(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        for values in self.recorded:
            merged.update(values)
        return merged


def effect_context(
    workspace: Path,
    file: str,
    operation_id: str = "job_0000000000aaaaaaaaaaaaaaaa:publish",
    secrets: dict[str, dict[str, Any]] | None = None,
    endpoints: Endpoints | None = None,
    build_number: int | None = None,
    recorder: EffectRecorder | None = None,
) -> tuple[EffectContext, EffectRecorder]:
    seen = recorder or EffectRecorder()

    def secret(name: str) -> dict[str, Any]:
        return dict((secrets or {})[name])

    context = EffectContext(
        operation_id=operation_id,
        workspace=workspace,
        file=workspace / file,
        build_number=build_number,
        endpoints=endpoints or Endpoints(),
        record=lambda values: seen.recorded.append(dict(values)),
        line=seen.lines.append,
        secret=secret,
        time_left=lambda: seen.time_left_sec,
        wait=seen.wait,
        now=lambda: seen.clock,
    )
    return context, seen
