"""The records of one stage attempt on this agent: the run the agent's threads share while the
attempt lasts, and the report that ends it; and HandBack, what a stage thread raises to give its
message straight back. The stage message the state machine sent is relevo_core's
(relevo_core.models.stage_message), named here too for the agent's modules.

Every other agent module builds on these; this one imports none of them at run time.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, field_validator

from relevo_core.models.stage_message import StageMessage as StageMessage  # re-exported for the agent
from relevo_core.models.status import StageStatus
from relevo_core.plan_limits import bounded_cause
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.ending import Ending
    from relevo_agent.lease import Lease
    from relevo_agent.transfer import ProgressWriter


def utc_now() -> datetime:
    return datetime.now(UTC)


class HandBack(Exception):
    """Trouble before the claim took (a connection reset, a timeout): the message goes straight
    back to the queue (visibility 0) for this agent or another to take, never waits out its
    visibility timeout."""


@dataclass
class StageRun:
    """One attempt this agent is running: what the keeper, shutdown and the runner share."""

    ref: stage_attempts.StageRef
    lease: Lease
    # Monotonic: the claim's send time plus the stage's exec_timeout_sec (the exec timeout counts
    # from the claim, probe and waits included).
    exec_deadline: float = math.inf
    # The state machine has handed this attempt its run token (it took the claim): seen on the
    # stage record beside the stage (the command does not wait for it). The token itself stays in
    # the job's token partition, which no job session reads: heartbeats and the report go through
    # the region's claim routes, which answer it for the claim that holds the attempt.
    run_handed: bool = False
    token_known: threading.Event = field(default_factory=threading.Event)
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    # Why the command is being stopped: lease_lost, fenced, canceled, no_run_token, shutdown.
    reason: str | None = None
    # The attempt's artifact upload as it goes: the lease keeper writes its readings with renewals.
    transfer: ProgressWriter | None = None
    # The attempt's log (relevo_agent.logs.LogShipper), from its checkout to its end.
    shipper: Any = None
    # The claim's proof, for its job credentials (relevo_agent.job_sessions).
    claim_secret: str | None = None
    # A report of the attempt is in the outbox, which lets its job credentials go once sent.
    reported: bool = False
    # How the attempt ended, once concluded (relevo_agent.conclude, Concluder.end: exactly once).
    ending: Ending | None = None

    def close_log(self) -> None:
        """The log's backlog stored (once): before the report, which ends the attempt's lease."""
        shipper, self.shipper = self.shipper, None
        if shipper is not None:
            shipper.close()

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.cancel.set()

    def stop_grace(self, kill_grace_sec: float) -> float:
        """SIGTERM-to-SIGKILL grace of a stop: a fence gives what the lease leaves of the grace."""
        return self.lease.grace_sec if self.reason == "fenced" else kill_grace_sec

    def exec_left(self) -> float:
        return max(0.0, self.exec_deadline - time.monotonic())


class StageReport(BaseModel):
    """What an attempt ended with, as the journal's outbox keeps it until Relevo has it: sent to
    the region's outcome route, which makes the fenced stage write and answers the run token
    (relevo_agent.outbox). Its JSON form is the outbox entry, so a report journaled by an earlier
    agent reads back unchanged (a `run_token` such a report kept is ignored: the route has it)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    job_id: str
    stage: str
    stage_index: int
    shard: int | None = None
    attempt: int
    status: StageStatus
    outcome: stage_attempts.AttemptOutcome
    exit_code: int | None = None
    error: str | None = None  # an ErrorClass value
    cause: str | None = None
    receipt: dict[str, Any] | None = None
    # The attempt's tests (a ResultsSummary's JSON, relevo_agent.test_reports), when it declared any.
    tests: dict[str, Any] | None = None
    # Nothing of this attempt runs any more here: its lease ends with the report.
    lease_ended: bool = False
    # The claim's proof (relevo_agent.claim): the outcome route answers only the claim that shows
    # it, also after a restart. Kept in the journal only.
    claim_secret: str | None = None

    @field_validator("cause")
    @classmethod
    def _bounded(cls, cause: str | None) -> str | None:
        """Cut to relevo_core.plan_limits.MAX_FAILURE_CAUSE_CHARS: the state machine carries the
        cause (the stage's failure, the dead-letter path) inside Step Functions' quotas, which
        plan_limits' arithmetic counts with that bound (SendTaskFailure itself refuses a cause
        over 32,768 characters, which would leave the report in the outbox for good)."""
        return bounded_cause(cause) if cause is not None else None

    def payload(self) -> dict[str, Any]:
        """The outbox entry (JSON-ready); a report without a claim secret or a shard keeps the
        shape the journal held before there were any."""
        left_out = {name for name in ("claim_secret", "shard", "tests") if getattr(self, name) is None}
        return self.model_dump(mode="json", exclude=left_out or None)
