"""A drill's trial and the steps every drill shares: start the job and fault it mid-stage, judge
what happened (a duplicate or lost effect, a job failed that should have succeeded, a stage left
non-terminal), time the fence."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from relevo_core.fleet.lease_timeline import LeaseTimeline
from relevo_tools.drill.fleet import (
    TERMINAL_STAGE,
    DrillAgent,
    DrillError,
    DrillFleet,
    GroupWatch,
    StageStart,
)


class LateFault(DrillError):
    """The fault could not be injected before the effect might land: not a valid trial."""


class StalledFleet(LateFault):
    """A faulted job's other operations lost their leases on live agents (the local stack answered
    too slowly for their heartbeats): they were fenced and retried, which the drill cannot tell
    from what its fault caused. Not a valid trial either."""


@dataclass
class Trial:
    drill: str
    number: int
    outcome: str = ""
    # operation id -> effect lines, for every stage of every job of the trial
    effects: dict[str, int] = field(default_factory=dict)
    fence_sec: float | None = (
        # fault → the faulted command's process group gone (parallel: a shard's failure → its
        # siblings' groups gone)
        None
    )
    takeover_sec: float | None = None  # fault → the next attempt claimed by the other agent
    cancel_sec: float | None = None  # cancel → the process group gone (SIGTERM, no trap)
    attempts: int = 0
    # in-progress effects the next attempt resumed rather than started again (the release drills)
    resumed: int = 0
    problems: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def epoch_seconds(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


class DrillRun:
    """One trial of one drill on the fleet."""

    def __init__(self, fleet: DrillFleet, name: str, number: int) -> None:
        self.fleet = fleet
        self.timing = fleet.timing
        self.lease = LeaseTimeline(
            self.timing.lease_ttl_sec, self.timing.kill_grace_sec, self.timing.max_clock_skew_sec
        )
        self.trial = Trial(name, number)

    # ------------------------------------------------------------------ shared steps
    def start_job(self, kind: str = "standard", **project: Any) -> tuple[str, StageStart, DrillAgent]:
        """The job, its deliver stage's first start, and the agent holding it, once the holder has
        renewed once: the fault then lands mid-stage, well before the effect."""
        job_id = self.fleet.run(self.fleet.project(kind, **project))
        self.trial.jobs.append(job_id)
        start = self.fleet.wait_stage_start(job_id)
        holder = self.fleet.holder(job_id, 1)
        lead = min(self.lease.renew_interval_sec * 1.5, self.timing.effect_after_sec / 4)
        time.sleep(max(0.0, start.seen + lead - time.monotonic()))
        late = time.monotonic() - start.seen
        if late > self.timing.effect_after_sec / 2:
            # A loaded machine kept the drill from faulting in time: the effect could land first.
            raise LateFault(
                f"the fault came {late:.1f}s into a stage whose effect lands at "
                f"{self.timing.effect_after_sec:g}s"
            )
        return job_id, start, holder

    def judge(self, job_id: str, expected: str, fault_wall: float | None = None) -> dict[str, Any]:
        job = self.fleet.job(job_id)
        counts = self.fleet.effect_counts(job_id)
        if job["status"] != expected:
            kind = "wrongly failed job" if expected == "succeeded" else "unexpected outcome"
            self.trial.problems.append(
                f"{kind}: {job_id} {job['status']} ({job.get('error') or '-'}), expected {expected}"
            )
        for stage in job["stages"]:
            operation = f"{job_id}:{stage['name']}"
            effects = counts.get(operation, 0)
            self.trial.effects[operation] = effects
            if stage["status"] not in TERMINAL_STAGE:
                self.trial.problems.append(f"non-terminal stage: {operation} left {stage['status']}")
            if effects > 1:
                self.trial.problems.append(f"duplicate effect: {operation} landed {effects} times")
            if stage["status"] == "succeeded" and effects == 0:
                self.trial.problems.append(f"lost effect: {operation} succeeded without its effect")
        deliver = job["stages"][0]
        self.trial.attempts += deliver.get("attempt") or 0
        if fault_wall is not None and (deliver.get("attempt") or 0) > 1:
            claimed = epoch_seconds(deliver.get("started_at"))
            self.trial.takeover_sec = claimed - fault_wall if claimed else None
        return job

    def fenced(self, watch: GroupWatch, fault_mono: float, limit: float) -> None:
        gone = watch.wait(limit)
        self.trial.fence_sec = gone - fault_mono if gone is not None else None

    def describe(self, job: dict[str, Any]) -> str:
        deliver = job["stages"][0]
        attempts = deliver.get("attempt") or 0
        decision = (deliver.get("reconciled") or {}).get("decision")
        words = f"{job['status']}"
        if attempts > 1:
            words += f", attempt {attempts} on {deliver.get('agent_id')}"
        if decision:
            words += f" ({decision})"
        return words


Drill = Callable[[DrillFleet, int], Trial]
