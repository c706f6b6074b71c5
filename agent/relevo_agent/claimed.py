"""A stage attempt whose claim took, as the steps of its run share it (relevo_agent.stage,
relevo_agent.settle).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relevo_agent.attempt import StageMessage, StageRun
from relevo_agent.claim import Claimed
from relevo_agent.journal import Operation
from relevo_agent.messages import Message

if TYPE_CHECKING:
    from relevo_core.jobs.handoff_sources import JobContext
    from relevo_core.models.envelope import JobEnvelope
    from relevo_core.models.plan import StagePlan


@dataclass
class ClaimedAttempt:
    """An attempt whose claim took, as its steps share it (relevo_agent.stage): the message and
    its task, the job as the claim's answer brought it, the run, and what this journal held of the
    operation before the claim (`local`, which reconcile reads). `keepers`: the threads beside the
    stage (lease, heartbeat, run token), stopped once it is concluded."""

    task: StageMessage
    message: Message
    op_id: str
    workspace: Path
    context: JobContext
    run: StageRun
    local: Operation | None
    claimed: Claimed
    keepers: list[threading.Thread] = field(default_factory=list)

    @property
    def envelope(self) -> JobEnvelope:
        return self.context.envelope

    @property
    def plan(self) -> StagePlan:
        return self.context.envelope.stage(self.task.stage)

    @property
    def previous(self) -> dict[str, Any]:
        """The stage record as the previous attempt left it (the claim's answer)."""
        return self.claimed.granted.previous
