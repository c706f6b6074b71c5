"""What the console's routes share (app.state.console): the API, who it signs as, the stream's
settings, and the job costs read lately."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relevo_cli.api import RelevoApi
from relevo_cli.console import actions
from relevo_cli.console.stream import StreamSettings

# A job's cost is read from its execution history (GET /jobs/{id}/cost pages through
# GetExecutionHistory), the panel's slowest read, and the panel re-renders on every state event
# while the page streams the log. The history grows as the job moves (a status, a stage's status
# or attempt): a cost is kept for the job as it was read, for at most JOB_COST_MAX_AGE_SEC (a
# queued job's wait cycles add transitions without moving it), for the last JOB_COSTS_KEPT jobs.
JOB_COST_MAX_AGE_SEC = 30.0
JOB_COSTS_KEPT = 256


@dataclass
class Console:
    """What the console's routes share: the API, who it signs as, and the stream's settings."""

    api: RelevoApi
    settings: StreamSettings = field(default_factory=StreamSettings)
    caller: Callable[[], str] | None = None
    # Where `git ls-remote` finds a project's repository (None: GitHub's or GitLab's).
    git_base_url: str | None = None
    clock: Callable[[], float] = time.monotonic
    _caller_arn: str | None = None
    _costs: OrderedDict[str, tuple[tuple[Any, ...], float, dict[str, Any]]] = field(
        default_factory=OrderedDict
    )
    _costs_lock: threading.Lock = field(default_factory=threading.Lock)

    def caller_arn(self) -> str:
        if self._caller_arn is None:
            self._caller_arn = (self.caller or (lambda: actions.caller_arn(self.api)))()
        return self._caller_arn

    def job_cost(self, job: dict[str, Any]) -> dict[str, Any]:
        """The job's cost as the API counts it, read again only once the job has moved since."""
        job_id, moved = job["job_id"], job_progress(job)
        with self._costs_lock:
            kept = self._costs.get(job_id)
            if kept is not None and kept[0] == moved and self.clock() - kept[1] < JOB_COST_MAX_AGE_SEC:
                self._costs.move_to_end(job_id)
                return kept[2]
        cost = self.api.job_cost(job_id)  # an ApiError (a held job has no execution yet) is not kept
        with self._costs_lock:
            self._costs[job_id] = (moved, self.clock(), cost)
            self._costs.move_to_end(job_id)
            while len(self._costs) > JOB_COSTS_KEPT:
                self._costs.popitem(last=False)
        return cost


def job_progress(job: dict[str, Any]) -> tuple[Any, ...]:
    """What changes whenever the job's execution takes steps: its status and stage, and each
    stage's status and attempt."""
    return (
        job["status"],
        job.get("current_stage"),
        job.get("waiting_stage"),
        tuple(
            (stage.get("name"), stage.get("status"), stage.get("attempt"), stage.get("retry_count"))
            for stage in job.get("stages") or []
        ),
    )
