"""What a restarted agent does, before it takes any work, with the attempts its previous run left.

Every operation the journal shows in flight was interrupted (its supervisor killed the command
when the agent died); the journal begins an operation before its claim is sent, so it knows every
attempt this agent may hold. Each is reported failed with cause agent_restart_interrupted and outcome
unknown: Relevo.Transient.AgentShutdown is retryable, and the next attempt reconciles before it
runs anything. The report ends the attempt's lease only once its process group is seen gone, so
a successor never probes beside a command still dying. Reports left in the outbox are sent.
"""

from __future__ import annotations

import logging
import os
import time

from relevo_agent.attempt import StageReport
from relevo_agent.journal import Journal, Operation, OperationOutcome
from relevo_agent.outbox import Outbox
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts

log = logging.getLogger(__name__)

RESTART_INTERRUPTED = "agent_restart_interrupted"
# How long a restarted agent waits for an interrupted command's group to be gone (its supervisor
# SIGTERMs it when the agent dies and SIGKILLs it after the stage's kill grace).
RESTART_GROUP_WAIT_SEC = 30.0


def recover(journal: Journal, outbox: Outbox) -> None:
    """Report what the journal shows in flight as interrupted, then send the outbox: each report
    with its attempt's job credentials, asked for again with the claim secret the journal kept
    (relevo_agent.job_sessions). An attempt this agent no longer holds has nothing to report."""
    for op in journal.in_flight():
        log.warning(
            "restart: %s attempt %d was in flight; reporting it interrupted", op.operation_id, op.attempt
        )
        _interrupted(journal, op, lease_ended=_group_gone(op.pgid))
    outbox.flush()


def _interrupted(journal: Journal, op: Operation, lease_ended: bool) -> None:
    report = StageReport(
        job_id=op.job_id,
        stage=op.stage,
        stage_index=op.stage_index,
        shard=op.shard,
        attempt=op.attempt,
        status=StageStatus.FAILED,
        outcome=stage_attempts.AttemptOutcome.UNKNOWN,
        error=ErrorClass.AGENT_SHUTDOWN.value,
        cause=RESTART_INTERRUPTED,
        lease_ended=lease_ended,
        claim_secret=op.claim_secret,
    )
    journal.record(op.operation_id, op.attempt, OperationOutcome.ABANDONED, None, report.payload())


def _group_gone(pgid: int | None, wait_sec: float = RESTART_GROUP_WAIT_SEC) -> bool:
    """Whether the process group is gone, waiting for it up to `wait_sec`. Unknown (no group
    journaled: the command had not started, or the journal is older) counts as not known gone."""
    if pgid is None:
        return False
    deadline = time.monotonic() + wait_sec
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # another user's group now: not ours to wait for, and not known gone
        if time.monotonic() >= deadline:
            log.warning(
                "restart: process group %d is still there; the attempt's lease is left to run out", pgid
            )
            return False
        time.sleep(0.1)
