"""What every built-in release effect provides (relevo_agent.effects), and what the agent gives it.

The agent performs a kind's effect under the attempt's lease. Before the effect can have happened
the kind records its identifiers (`EffectContext.record`: journaled on this Mac first, then on the
stage record), so that a later attempt -- on this Mac or another -- can `probe` for it by what
Apple or the host keeps, and `resume` it (wait for it) rather than start it again. The probe's
answer is one of the four of the reconcile table (relevo_agent.reconcile):

    DONE         the effect exists and is this operation's: the stage succeeds with the evidence
    ABSENT       nothing of it exists: run again (perform) under the same operation id
    IN_PROGRESS  it was started and is under way: resume, never start a second one
    CANNOT_TELL  a network error, a found effect that is not this operation's: manual review
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from relevo_core.models.errors import ErrorClass


class Answer(str, Enum):
    DONE = "done"
    ABSENT = "absent"
    IN_PROGRESS = "in_progress"
    CANNOT_TELL = "cannot_tell"


@dataclass(frozen=True)
class ProbeAnswer:
    answer: Answer
    # What was found, for the people who ship (ids, Apple's state): kept as the reconcile's
    # evidence and shown in the stage's log. Never a secret.
    evidence: str
    # The values the stage leaves when the answer is DONE (as `perform` would have left them).
    values: Mapping[str, str] = field(default_factory=dict)


class EffectFailed(Exception):
    """The effect cannot be done. `error_class` is the stage's failure: EFFECT_REFUSED (bad input,
    nothing submitted), EFFECT_REJECTED (Apple turned it down), or a transient class (the network)
    when a retry may succeed -- a retry reconciles (probes) before it acts again."""

    def __init__(self, error_class: ErrorClass, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


@dataclass(frozen=True)
class Endpoints:
    """Where the APIs are: Apple's and GitHub's own, or (tests, the demo) the local service's,
    from the agent's config."""

    app_store_connect: str = "https://api.appstoreconnect.apple.com"
    notary: str = "https://appstoreconnect.apple.com/notary/v2"
    github: str = "https://api.github.com"


@dataclass(frozen=True)
class EffectContext:
    """What the agent gives a kind for one attempt."""

    operation_id: str
    workspace: Path
    # The file the effect sends, resolved in the workspace (no link out of it).
    file: Path
    build_number: int | None
    endpoints: Endpoints
    # Journal first, then the stage record (fenced): the identifiers before the effect.
    record: Callable[[dict[str, str]], None]
    # A line in the stage's log, as it happens (masked like every line).
    line: Callable[[str], None]
    # A secret under the project's release prefix, read with the job's session: a JSON object.
    secret: Callable[[str], dict[str, Any]]
    # Seconds left of the stage's exec timeout, on the monotonic clock.
    time_left: Callable[[], float]
    # Waits up to that many seconds, sooner when the attempt is stopped; True when stopped.
    wait: Callable[[float], bool]
    # Wall-clock seconds (a JWT's iat and exp).
    now: Callable[[], float]


class EffectKind(Protocol):
    """One kind, made from its declaration (relevo_core.models.effect)."""

    def perform(self, context: EffectContext) -> dict[str, str]:
        """Do the effect, recording its identifiers first; return the values the stage leaves
        (ids, Apple's state). Raises EffectFailed."""
        ...

    def probe(self, context: EffectContext, recorded: Mapping[str, str]) -> ProbeAnswer:
        """What became of the effect a previous attempt recorded (`recorded`: its values, maybe
        empty when it died before it recorded anything). Reads only; never raises for the network
        (CANNOT_TELL)."""
        ...

    def resume(self, context: EffectContext, recorded: Mapping[str, str]) -> dict[str, str]:
        """Wait for the effect under way that `recorded` names, never starting another; return the
        values the stage leaves. Raises EffectFailed."""
        ...
