"""Which stages this agent takes in, decided before any claim from the stage message alone (the
envelope comes with the claim): a lease it can keep, the signing gate, and the stage's workspace
reserved, marked used and locked against removal until the stage ends, when its retention
(relevo_agent.hygiene) applies.

The signing gate: a temporary keychain goes on the user's search list, which every process of the
user searches (relevo_agent.keychain), so a stage with one runs alone on this agent; a stage that
finds the gate closed goes back to its queue for a while, as a fresh copy.

One stage per workspace: a stage runs in `<workspace_root>/<project>`, and only one stage of any
agent process of this Mac runs there at a time (WorkspaceLocks.occupying). A stage without shards
always has it (the project's lock lets one of its jobs run at a time, one stage after another).
Shards of one stage may share a Mac (fewer Macs than shards, relevo_agent.placement): a shard
takes the first of `<project>`, `<project>.2`, `<project>.3`, … no other stage occupies, so two
shards never check out, clean or build in one tree at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.attempt import HandBack, StageMessage
from relevo_agent.config import AgentConfig
from relevo_agent.hygiene import Hygiene
from relevo_agent.journal import Journal
from relevo_agent.messages import Message
from relevo_core.fleet.lease_timeline import LeaseTimeline

log = logging.getLogger(__name__)

# A shard looks at most this many workspaces of its project for a free one (far above any Mac's
# capacity): beyond it the message goes back to its queue, as when the signing gate is closed.
SHARD_WORKSPACES_MAX = 64


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
        skew only (a kill grace the lease has no room for is cut short: relevo_core.fleet.lease_timeline)."""
        timeline = LeaseTimeline(task.lease_ttl_sec, 0, self.config.max_clock_skew_sec)
        if not timeline.feasible:
            log.error(
                "%s: a lease of %ds leaves no renewal before the fence with max_clock_skew_sec %g; "
                "not taking it (raise the project's lease_ttl_sec)",
                op_id,
                task.lease_ttl_sec,
                self.config.max_clock_skew_sec,
            )
            raise HandBack("the lease is too short for this agent")
        return timeline

    @contextmanager
    def admitted(self, task: StageMessage, message: Message, op_id: str) -> Iterator[Reservation | None]:
        """The stage's workspace, reserved for the duration; None when the signing gate is closed
        or, for a shard, every workspace of its project is occupied (the message was sent back to
        its queue for later)."""
        signing = task.signs
        with ExitStack() as held:
            with self._lock:
                busy = bool(self._workspaces) if signing else bool(self._signing)
                workspace = None if busy else self._free_workspace(task, held)
                if workspace is not None:
                    self._workspaces[op_id] = workspace
                    if signing:
                        self._signing.add(op_id)
            if workspace is None:
                self._send_back(
                    message,
                    op_id,
                    "a signing stage runs alone and others run here"
                    if signing and busy
                    else "a signing stage runs here alone"
                    if busy
                    else "every workspace of its project is in use",
                )
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

    def _free_workspace(self, task: StageMessage, held: ExitStack) -> Path | None:
        """The workspace the stage runs in, occupied (until `held` closes), or None: none is free.
        A stage without shards has its project's; a shard the first of its project's no other
        stage occupies."""
        root = self.config.workspace_root
        names = (
            [task.project]
            if task.shard is None
            else [task.project] + [f"{task.project}.{n}" for n in range(2, SHARD_WORKSPACES_MAX + 1)]
        )
        in_use = set(self._workspaces.values())
        for name in names:
            workspace = root / name
            if workspace in in_use:
                continue
            occupying = held.enter_context(ExitStack())
            if occupying.enter_context(self.hygiene.locks.occupying(workspace)):
                return workspace
            occupying.close()  # another agent process of this Mac runs a stage there
        if task.shard is None:
            # The project's workspace occupied by another agent process of this Mac (a shard of
            # another of its jobs' stages cannot be: one job of a project runs at a time): the
            # stage runs there as it always did, rather than wait behind what should not be.
            log.warning(
                "%s: workspace %s is occupied by another stage of this Mac; running there all the same",
                task.project,
                root / task.project,
            )
            return root / task.project
        return None

    def _send_back(self, message: Message, op_id: str, why: str) -> None:
        log.info("%s: %s; its message returns in %ds", op_id, why, self.config.handoff_delay_sec)
        # A fresh copy (Message.resend): however often it waits here, never the redrive DLQ.
        try:
            message.resend(max(1, self.config.handoff_delay_sec))
        except (BotoCoreError, ClientError):
            message.give_back_after(max(1, self.config.handoff_delay_sec))
