"""What a restarted agent does, before it takes any work, with the attempts its previous run left.

Every operation the journal shows in flight was interrupted (its supervisor killed the command
when the agent died). Each is reported failed with cause agent_restart_interrupted and outcome
unknown: Relevo.Transient.AgentShutdown is retryable, and the next attempt reconciles before it
runs anything. The report ends the attempt's lease only once its process group is seen gone, so
a successor never probes beside a command still dying. Reports left in the outbox are sent.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.attempt import StageReport
from relevo_agent.journal import Journal, Operation, OperationOutcome, operation_id
from relevo_agent.outbox import Outbox
from relevo_core.models.errors import ErrorClass
from relevo_core.models.status import StageStatus
from relevo_core.store import stage_attempts

log = logging.getLogger(__name__)

RESTART_INTERRUPTED = "agent_restart_interrupted"
# How long a restarted agent waits for an interrupted command's group to be gone (its supervisor
# SIGTERMs it when the agent dies and SIGKILLs it after the stage's kill grace).
RESTART_GROUP_WAIT_SEC = 30.0


def recover(journal: Journal, table_name: str, agent_id: str, outbox: Outbox, stack_gone: Callable[[BaseException], bool]) -> None:
    """Report what the journal shows in flight as interrupted, then send the outbox.

    Attempts Relevo records as held by this agent_id that the journal does not know are taken
    over only when this journal claimed them; any other (a lost journal, or another Mac
    running with this agent_id) is left to its lease, which its own holder fences. An error that
    says the stack is gone (`stack_gone`) is raised: the agent cannot start."""
    for op in journal.in_flight():
        log.warning("restart: %s attempt %d was in flight; reporting it interrupted", op.operation_id, op.attempt)
        _interrupted(journal, op, lease_ended=_group_gone(op.pgid))
    try:
        held = stage_attempts.held_by(table_name, agent_id)
    except (BotoCoreError, ClientError) as exc:
        if stack_gone(exc):
            raise
        log.warning("restart: cannot list the attempts this agent holds (%s); their leases will expire", exc)
        held = []
    for attempt in held:
        job_id, stage = attempt.job_id, attempt.stage_name
        known = journal.get(operation_id(job_id, stage))
        if known is not None and known.attempt == attempt.attempt:
            continue
        if attempt.journal_id != journal.journal_id:
            log.warning(
                "restart: %s:%s attempt %s is held by agent_id %s but was claimed from another journal; left to its lease",
                job_id, stage, attempt.attempt, agent_id,
            )
            continue
        log.warning("restart: %s:%s attempt %s was claimed from this journal but is not in it; failing it", job_id, stage, attempt.attempt)
        op = Operation(
            operation_id(job_id, stage), job_id, stage, attempt.stage_index, attempt.attempt, "", "",
            run_token=attempt.run_token,
        )
        journal.begin(op)
        _interrupted(journal, op, lease_ended=False)
    outbox.flush()


def _interrupted(journal: Journal, op: Operation, lease_ended: bool) -> None:
    report = StageReport(
        job_id=op.job_id,
        stage=op.stage,
        stage_index=op.stage_index,
        attempt=op.attempt,
        run_token=op.run_token,
        status=StageStatus.FAILED,
        outcome=stage_attempts.AttemptOutcome.UNKNOWN,
        error=ErrorClass.AGENT_SHUTDOWN.value,
        cause=RESTART_INTERRUPTED,
        lease_ended=lease_ended,
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
            log.warning("restart: process group %d is still there; the attempt's lease is left to run out", pgid)
            return False
        time.sleep(0.1)
