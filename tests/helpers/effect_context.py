"""An EffectContext (relevo_agent.effects.kind) for a kind's test against the local Apple service:
what the kind records and logs kept in lists, the project's secrets a dict, and time the
service's injected clock -- `wait` moves it (no real sleep) and the stage's time left shrinks by
what was waited."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from relevo_agent.effects.kind import EffectContext, Endpoints
from relevo_local.apple.service import AppleService
from tests.helpers.local_apple import TeamKey

SECRET = "relevo/dev/_release/app/asc-key"


def key_secret(key: TeamKey) -> dict[str, str]:
    """The team key as a project stores it in Secrets Manager."""
    pem = key.private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {"key_id": key.key_id, "issuer_id": key.issuer, "private_key": pem}


@dataclass
class Recorder:
    service: AppleService
    secrets: dict[str, Any]
    time_left_sec: float = 3600.0
    records: list[dict[str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)
    stop_after_waits: int | None = None
    # Called after each record (a test's hook: something landing at Apple, the Mac dying).
    on_record: Callable[[dict[str, str]], None] | None = None

    @property
    def recorded(self) -> dict[str, str]:
        """What the stage record holds: the last values recorded."""
        return dict(self.records[-1]) if self.records else {}

    def record(self, values: dict[str, str]) -> None:
        self.records.append(dict(values))
        if self.on_record is not None:
            self.on_record(values)

    def secret(self, name: str) -> dict[str, Any]:
        if name not in self.secrets:
            raise KeyError(f"ResourceNotFoundException: {name}")
        return dict(self.secrets[name])

    def wait(self, seconds: float) -> bool:
        self.waited.append(seconds)
        self.service.clock.advance(seconds)
        self.time_left_sec -= seconds
        return self.stop_after_waits is not None and len(self.waited) >= self.stop_after_waits

    def context(self, file: Path, operation_id: str = "job_1:upload") -> EffectContext:
        return EffectContext(
            operation_id=operation_id,
            workspace=file.parent,
            file=file,
            build_number=None,
            endpoints=Endpoints(app_store_connect=self.service.url, notary=f"{self.service.url}/notary/v2"),
            record=self.record,
            line=self.lines.append,
            secret=self.secret,
            time_left=lambda: self.time_left_sec,
            wait=self.wait,
            now=lambda: self.service.clock.now().timestamp(),
        )
