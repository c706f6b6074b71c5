"""Why this agent stops, said once and seen by every loop of it (as buildkite/agent cancels one
context): the poll, presence, job credentials, the outbox and each stage's lease keeper hold the
same AgentStop instead of a callback each.

Two ways to stop:
- `gracefully()`: take no new stage and let the running ones finish (a first signal, a drain);
- `ungracefully(why)`: the agent must exit (its stack is gone or the stack file names another,
  another process took its agent_id); the supervisor stops the running stages and exits with the
  one line `fatal` says. Only the first reason is kept.

`stack_gone(exc)` is the one place that tells an error of a stack that no longer exists (its
table or work queue) from a network fault: retrying cannot help then, a restart can.
"""

from __future__ import annotations

import threading

from botocore.exceptions import ClientError

from relevo_core.aws import error_code

# Error codes that say a resource of the stack no longer exists (DynamoDB's table or index; SQS's
# queue, in its query and JSON protocol spellings).
_GONE = {
    "ResourceNotFoundException": "the table {table}",
    "AWS.SimpleQueueService.NonExistentQueue": "the work queue {queue}",
    "QueueDoesNotExist": "the work queue {queue}",
}


class AgentStop:
    """`table` and `queue` name the stack's resources in the line a stack that is gone is said
    with; `follow_stack`: the caller starts again against the stack the stack file names
    (relevo_agent.launch), so a stack that moved is said as no error."""

    def __init__(self, table: str = "", queue: str = "", follow_stack: bool = False) -> None:
        self.table = table
        self.queue = queue
        self.follow_stack = follow_stack
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # Why this agent must exit (None: it need not).
        self.fatal: str | None = None
        # The stack this agent was started against is gone or replaced (not: its agent_id taken).
        self.stack_moved = False

    def is_set(self) -> bool:
        """Stopping, either way: no loop starts anything new."""
        return self._stopping.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` for a stop; True once stopping (a loop's interruptible sleep)."""
        return self._stopping.wait(timeout)

    def gracefully(self) -> None:
        self._stopping.set()

    def ungracefully(self, why: str, stack_moved: bool = False) -> None:
        with self._lock:
            if self.fatal is None:
                self.fatal = why
                self.stack_moved = stack_moved
        self._stopping.set()

    def stack_gone(self, exc: BaseException | None) -> bool:
        """True (and the agent stopping ungracefully) when `exc` says the stack itself no longer exists."""
        if not isinstance(exc, ClientError):
            return False
        code = error_code(exc)
        if code not in _GONE:
            return False
        what = _GONE[code].format(table=self.table, queue=self.queue)
        then = (
            "starting again once the stack file names a stack"
            if self.follow_stack
            else "exiting so that a restart reads the stack file again"
        )
        self.ungracefully(f"the stack is gone: {what} does not exist ({code}); {then}", stack_moved=True)
        return True
