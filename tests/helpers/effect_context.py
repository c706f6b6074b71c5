"""The EffectContext (relevo_agent.effects.kind) every built-in kind's tests give the kind: what the
agent gives one attempt, with what the kind did kept to assert on.

An `Attempt` keeps each record's values in order (`records`) and merged as a later attempt gets
them from the stage record (`recorded`), the log lines, the release keys read, the seconds waited.
Its time is injected: a number of its own, or the local Apple service's clock
(tests/helpers/local_apple.py) when it is given one, so the tokens a kind signs are the service's
time. Each `wait` moves that clock and uses up the stage's time left (no real sleep), then
`stop_when` says whether the attempt was told to stop. Release keys are read as the agent reads
them (relevo_agent.effects.agent_side.ReleaseKeys): a JSON object, a missing one or one that is not
an object refused with EFFECT_REFUSED and the same words."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from relevo_agent.effects.agent_side import key_object
from relevo_agent.effects.kind import EffectContext, EffectFailed, Endpoints
from relevo_core.models.errors import ErrorClass
from relevo_local.apple.service import AppleService
from tests.helpers.local_apple import TeamKey

OPERATION = "job_0123456789abcdefghij:release"
CLOCK = 1_796_000_000.0


def key_secret(key: TeamKey) -> dict[str, str]:
    """A team key as the project stores it in Secrets Manager: the .p8's PEM text and its ids."""
    pem = key.private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {"key_id": key.key_id, "issuer_id": key.issuer, "private_key": pem}


@dataclass
class Attempt:
    # Release keys by name: a JSON object, or the text Secrets Manager holds (read by key_object).
    secrets: dict[str, Any] = field(default_factory=dict)
    # The local Apple service whose clock is this attempt's time; None: `clock`.
    service: AppleService | None = None
    clock: float = CLOCK
    time_left_sec: float = 3600.0
    # After each wait: True tells the attempt to stop (the agent's cancel).
    stop_when: Callable[[Attempt], bool] = lambda _attempt: False
    # After each record (a test's hook: something landing at Apple, the Mac dying).
    on_record: Callable[[dict[str, str]], None] | None = None
    records: list[dict[str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    secrets_read: list[str] = field(default_factory=list)

    @property
    def recorded(self) -> dict[str, str]:
        """The values as a later attempt gets them: every record, merged in order."""
        merged: dict[str, str] = {}
        for values in self.records:
            merged.update(values)
        return merged

    @property
    def waited(self) -> float:
        return sum(self.waits)

    def record(self, values: dict[str, str]) -> None:
        self.records.append(dict(values))
        if self.on_record is not None:
            self.on_record(values)

    def secret(self, name: str) -> dict[str, Any]:
        self.secrets_read.append(name)
        if name not in self.secrets:
            raise EffectFailed(
                ErrorClass.EFFECT_REFUSED, f"the key {name} could not be read (ResourceNotFoundException)"
            )
        value = self.secrets[name]
        return dict(value) if isinstance(value, dict) else key_object(name, value)

    def now(self) -> float:
        return self.service.clock.now().timestamp() if self.service is not None else self.clock

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if self.service is not None:
            self.service.clock.advance(seconds)
        else:
            self.clock += seconds
        self.time_left_sec -= seconds
        return self.stop_when(self)

    def endpoints(self) -> Endpoints:
        """The local Apple service's, when there is one; else Apple's and GitHub's own."""
        if self.service is None:
            return Endpoints()
        return Endpoints(app_store_connect=self.service.url, notary=f"{self.service.url}/notary/v2")

    def context(
        self,
        file: Path,
        operation_id: str = OPERATION,
        endpoints: Endpoints | None = None,
        workspace: Path | None = None,
        build_number: int | None = None,
    ) -> EffectContext:
        """`file` resolved already (a path in `workspace`, its directory by default)."""
        return EffectContext(
            operation_id=operation_id,
            workspace=workspace or file.parent,
            file=file,
            build_number=build_number,
            endpoints=endpoints or self.endpoints(),
            record=self.record,
            line=self.lines.append,
            secret=self.secret,
            time_left=lambda: self.time_left_sec,
            wait=self.wait,
            now=self.now,
        )
