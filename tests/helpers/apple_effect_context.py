"""An EffectContext (relevo_agent.effects.kind) for the tests of an Apple kind against the local
Apple service (tests/helpers/local_apple.py): what the kind records and logs is kept in a `Trace`,
its time is the service's injected clock (each `wait` moves it and uses up the stage's time: no
real sleep), and its secrets are a dict, a name not in it answered as Secrets Manager answers a
missing secret."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError
from cryptography.hazmat.primitives import serialization

from relevo_agent.effects.kind import EffectContext, Endpoints
from relevo_local.apple.service import AppleService
from tests.helpers.local_apple import TeamKey


@dataclass
class Trace:
    records: list[dict[str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    budget_sec: float = 3600.0
    # Called after each wait with the trace: True stops the attempt (the agent told to stop).
    stop_when: Callable[[Trace], bool] = lambda _trace: False

    @property
    def recorded(self) -> dict[str, str]:
        """The values as a later attempt gets them: every record, merged in order."""
        merged: dict[str, str] = {}
        for record in self.records:
            merged.update(record)
        return merged

    @property
    def waited(self) -> float:
        return sum(self.waits)


def key_secret(key: TeamKey) -> dict[str, Any]:
    """A team key as the project stores it in Secrets Manager: the .p8's PEM text and its ids."""
    pem = key.private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {"key_id": key.key_id, "issuer_id": key.issuer, "private_key": pem}


def effect_context(
    service: AppleService,
    file: Path,
    secrets: dict[str, dict[str, Any]],
    operation_id: str = "job_0123456789abcdefghij:notarize",
    trace: Trace | None = None,
    notary: str | None = None,
) -> tuple[EffectContext, Trace]:
    trace = trace or Trace()

    def secret(name: str) -> dict[str, Any]:
        if name not in secrets:
            error = {"Code": "ResourceNotFoundException", "Message": "Secrets Manager can't find the secret."}
            raise ClientError({"Error": error}, "GetSecretValue")
        return secrets[name]

    def wait(seconds: float) -> bool:
        trace.waits.append(seconds)
        service.clock.advance(seconds)
        return trace.stop_when(trace)

    context = EffectContext(
        operation_id=operation_id,
        workspace=file.parent,
        file=file,
        build_number=None,
        endpoints=Endpoints(notary=notary or f"{service.url}/notary/v2"),
        record=lambda values: trace.records.append(dict(values)),
        line=trace.lines.append,
        secret=secret,
        time_left=lambda: trace.budget_sec - trace.waited,
        wait=wait,
        now=lambda: service.clock.now().timestamp(),
    )
    return context, trace
