"""The writes the project lock's states share: on the lock item (acquire, release, the holder's
approval gate) and on the job's record as it leaves the queue (it runs, or gives up) and gives
back its queue slot. lock.py takes and releases the lock with them; lock_line.py waits for it."""

from __future__ import annotations

from typing import Any

from relevo_core.models.status import JobStatus
from relevo_core.store import keys
from relevo_tools.job_machine.asl import (
    EXECUTION_NAME,
    ME,
    NOW,
    STATUS,
    WRITER,
    job_key,
    queue_counter_key,
    update,
)

# The job leaves the queue: what intake and the wait wrote for a queued job goes.
LEAVE_QUEUE = (
    f"REMOVE {keys.START_PENDING_ATTRIBUTE}, queue_reason, {keys.WAITING_FOR_ATTRIBUTE}, "
    f"{keys.WAKE_TOKEN_ATTRIBUTE}"
)
COUNT = {"#count": "count"}
# The lock's `gate`: the holder waits at its approval gate ({job_id, stage, since}), written by
# AwaitApproval and taken off by MarkApproved (approval.py), by every release, and by an acquire
# (a lock with room has no holder whose gate it could be). A job queued behind such a holder
# parks in WaitBehindGate, which spends none of its queue timeout (execution.gate_wait).
GATE = "gate"
# Acquiring: one more holder, this execution, while the lock has room and this execution is not a holder yet.
ACQUIRE = f"SET #count = if_not_exists(#count, :zero) + :one, kind = :kind REMOVE {GATE} ADD holders :me"
HAS_ROOM = "(attribute_not_exists(#count) OR #count < :limit) AND NOT contains(holders, :name)"
ACQUIRE_VALUES = {
    ":zero": {"N": "0"},
    ":one": {"N": "1"},
    ":limit": {"N": "1"},
    ":kind": {"S": keys.LOCK_KIND},
    ":me": ME,
    ":name": {"S.$": EXECUTION_NAME},
}
RELEASE = f"ADD #count :minus_one, wake_seq :one DELETE holders :me REMOVE {GATE}"
HOLDS = "contains(holders, :name)"
RELEASE_VALUES = {":minus_one": {"N": "-1"}, ":me": ME, ":name": {"S.$": EXECUTION_NAME}, ":one": {"N": "1"}}


def starts_running() -> dict[str, Any]:
    """The job record: queued → running, out of the queue."""
    return {
        "Update": update(
            job_key(),
            f"SET #status = :running, last_writer = :writer, updated_at = :now {LEAVE_QUEUE}",
            condition="#status = :queued",
            names=STATUS,
            values={
                ":running": {"S": JobStatus.RUNNING.value},
                ":queued": {"S": JobStatus.QUEUED.value},
                ":writer": WRITER,
                ":now": NOW,
            },
        )
    }


def gives_back_queue_slot() -> dict[str, Any]:
    return {
        "Update": update(queue_counter_key(), "ADD queued :minus_one", values={":minus_one": {"N": "-1"}})
    }
