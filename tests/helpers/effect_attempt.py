"""An EffectContext (relevo_agent.effects.kind) for a kind tested without the local Apple
service (GitHub, S3): what the agent would give one attempt, with what the kind did kept to assert
on -- the values it recorded (in order), its log lines, the secrets it read -- an injected clock
and an injected wait (no real sleep)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relevo_agent.effects.kind import EffectContext, EffectFailed, Endpoints
from relevo_core.models.errors import ErrorClass


@dataclass
class Attempt:
    """One attempt's side of the context: secrets by name (a dict, or a bare string as Secrets
    Manager would hold it), the clock, and what the kind recorded and said."""

    secrets: dict[str, Any] = field(default_factory=dict)
    clock: float = 1_796_000_000.0
    exec_left: float = 600.0
    recorded: list[dict[str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)
    secrets_read: list[str] = field(default_factory=list)

    def record(self, values: dict[str, str]) -> None:
        self.recorded.append(dict(values))

    def secret(self, name: str) -> dict[str, Any]:
        self.secrets_read.append(name)
        if name not in self.secrets:
            raise EffectFailed(ErrorClass.EFFECT_REFUSED, f"the secret {name} does not exist")
        value = self.secrets[name]
        if isinstance(value, dict):
            return value
        # As relevo_agent.git_credentials.git_secret reads a secret that is not a JSON object.
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        return parsed if isinstance(parsed, dict) else {"password": str(value).strip()}

    def wait(self, seconds: float) -> bool:
        self.waited.append(seconds)
        self.clock += seconds
        self.exec_left -= seconds
        return False

    def all_recorded(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        for values in self.recorded:
            merged.update(values)
        return merged


def effect_context(
    workspace: Path,
    file: str,
    attempt: Attempt,
    endpoints: Endpoints | None = None,
    operation_id: str = "op-0123456789abcdef",
    build_number: int | None = None,
) -> EffectContext:
    return EffectContext(
        operation_id=operation_id,
        workspace=workspace,
        file=workspace / file,
        build_number=build_number,
        endpoints=endpoints or Endpoints(),
        record=attempt.record,
        line=attempt.lines.append,
        secret=attempt.secret,
        time_left=lambda: attempt.exec_left,
        wait=attempt.wait,
        now=lambda: attempt.clock,
    )
