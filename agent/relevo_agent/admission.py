"""Which stages this agent takes in, decided before any claim from the stage message alone (the
envelope comes with the claim): a lease it can keep, the signing gate, and the stage's workspace
reserved, marked used and locked against removal until the stage ends, when its retention
(relevo_agent.hygiene) applies.

The signing gate: a temporary keychain goes on the user's search list, which every process of the
user searches (relevo_agent.keychain), so a stage with one runs alone on this agent; a stage that
finds the gate closed goes back to its queue for a while, as a fresh copy.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.attempt import HandBack, StageMessage
from relevo_agent.config import AgentConfig
from relevo_agent.hygiene import Hygiene
from relevo_agent.journal import Journal
from relevo_agent.messages import Message
from relevo_core.lease_timeline import LeaseTimeline

log = logging.getLogger(__name__)


@dataclass
class Reservation:
    """A stage's workspace, held from before its claim to its end."""

    workspace: Path
    # The project's workspace_cleanup, once the claim brought its envelope.
    cleanup: str | None = None


class Admission:
    def __init__(self, config: AgentConfig, journal: Journal) -> None:
        self.config = config
        self._lock = threading.Lock()
        # The workspace of each stage thread from before its claim to its end (retention keeps them).
        self._workspaces: dict[str, Path] = {}
        # The stages that sign (each holds a temporary keychain).
        self._signing: set[str] = set()
        self.hygiene = Hygiene(config, journal, self.workspaces_in_use)

    def workspaces_in_use(self) -> set[Path]:
        with self._lock:
            return set(self._workspaces.values())

    def timeline(self, task: StageMessage, op_id: str) -> LeaseTimeline:
        """The lease as the message has it; a lease this agent could not keep is handed back
        (HandBack). Whether a renewal fits before the fence depends on the lease and the allowed
        skew only (a kill grace the lease has no room for is cut short: relevo_core.lease_timeline)."""
        timeline = LeaseTimeline(task.lease_ttl_sec, 0, self.config.max_clock_skew_sec)
        if not timeline.feasible:
            log.error(
                "%s: a lease of %ds leaves no renewal before the fence with max_clock_skew_sec %g; "
                "not taking it (raise the project's lease_ttl_sec)", op_id, task.lease_ttl_sec, self.config.max_clock_skew_sec,
            )
            raise HandBack("the lease is too short for this agent")
        return timeline

    @contextmanager
    def admitted(self, task: StageMessage, message: Message, op_id: str) -> Iterator[Reservation | None]:
        """The stage's workspace, reserved for the duration; None when the signing gate is closed
        (the message was sent back to its queue for later)."""
        workspace = self.config.workspace_root / task.project
        signing = task.signs
        with self._lock:
            busy = bool(self._workspaces) if signing else bool(self._signing)
            if not busy:
                self._workspaces[op_id] = workspace
                if signing:
                    self._signing.add(op_id)
        if busy:
            log.info("%s: %s; its message returns in %ds", op_id,
                     "a signing stage runs alone and others run here" if signing else "a signing stage runs here alone",
                     self.config.handoff_delay_sec)
            # A fresh copy (Message.resend): however often it waits here, never the redrive DLQ.
            try:
                message.resend(max(1, self.config.handoff_delay_sec))
            except (BotoCoreError, ClientError):
                message.give_back_after(max(1, self.config.handoff_delay_sec))
            yield None
            return
        reservation = Reservation(workspace)
        try:
            self.hygiene.used(workspace)
            # Held for the whole stage: no agent process of this machine removes the workspace under it.
            with self.hygiene.locks.using(workspace):
                yield reservation
        finally:
            with self._lock:
                self._workspaces.pop(op_id, None)
                self._signing.discard(op_id)
            self.hygiene.stage_ended(task.project, workspace, reservation.cleanup)
