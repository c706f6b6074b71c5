"""Waking the next job of a project when its lock is freed outside the state machine.

A job waiting for its project parks in job.asl.json's WaitForProject with a task token kept on its
record. The state machine's own releases wake the head of the line (FindHeadToWake → WakeHead);
cancel and the sweeper free locks and places in line too, and wake it the same way, so the next
job starts at once rather than at its fallback read of the lock.
"""

from __future__ import annotations

from relevo_core.execution import TaskGone, succeed_task
from relevo_core.store.wait_order import head_wake_token


def wake_next_waiter(table: str, project_id: str) -> bool:
    """Send the head of the project's line its wake; True if a parked task took it."""
    token = head_wake_token(table, project_id)
    if token is None:
        return False
    try:
        succeed_task(token, {"woken": True})
    except TaskGone:
        # The parked task timed out into its fallback read, or its execution ended: the head is
        # already reading the lock, or no longer waits.
        return False
    return True
