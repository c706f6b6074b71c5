"""The console reads a job's cost (its execution history, the panel's slowest read) again only
once the job has moved, or its read has aged: the panel re-renders on every state event."""

from __future__ import annotations

import boto3
import pytest

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.console.state import JOB_COST_MAX_AGE_SEC, JOB_COSTS_KEPT, Console


class CountingApi(RelevoApi):
    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9/v1", "us-east-1", boto3.session.Session(region_name="us-east-1"))
        self.reads: list[str] = []
        self.refuse: set[str] = set()

    def job_cost(self, job_id):
        self.reads.append(job_id)
        if job_id in self.refuse:
            raise ApiError(409, {"error": "JOB_NOT_STARTED", "message": "no execution yet"})
        return {"transitions": len(self.reads), "dollars": 0.0}


def job(job_id="job_a", status="running", stage="build", stage_status="running", attempt=1):
    return {
        "job_id": job_id,
        "status": status,
        "current_stage": stage,
        "stages": [{"name": "build", "status": stage_status, "attempt": attempt, "retry_count": attempt - 1}],
    }


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_cost_is_read_once_while_the_job_stands_still_and_again_when_it_moves():
    api, clock = CountingApi(), Clock()
    console = Console(api, clock=clock)
    first = console.job_cost(job())
    assert console.job_cost(job()) == first and api.reads == ["job_a"]
    # A stage's new status, a retry's attempt, the job's status: each is a step of the execution.
    console.job_cost(job(stage_status="succeeded"))
    console.job_cost(job(stage_status="succeeded", attempt=2))
    console.job_cost(job(status="succeeded", stage_status="succeeded", attempt=2))
    assert api.reads == ["job_a"] * 4
    assert console.job_cost(job(status="succeeded", stage_status="succeeded", attempt=2))["transitions"] == 4


def test_a_kept_cost_ages_out_and_a_refusal_is_not_kept():
    api, clock = CountingApi(), Clock()
    console = Console(api, clock=clock)
    console.job_cost(job(status="queued", stage=None, stage_status="pending"))
    clock.now += JOB_COST_MAX_AGE_SEC  # a queued job's wait cycles add transitions without moving it
    console.job_cost(job(status="queued", stage=None, stage_status="pending"))
    assert api.reads == ["job_a", "job_a"]

    api.refuse.add("job_held")
    for _ in range(2):
        with pytest.raises(ApiError):
            console.job_cost(job("job_held", status="held"))
    assert api.reads.count("job_held") == 2


def test_only_the_last_jobs_costs_are_kept():
    api = CountingApi()
    console = Console(api, clock=Clock())
    for n in range(JOB_COSTS_KEPT + 1):
        console.job_cost(job(f"job_{n}"))
    console.job_cost(job(f"job_{JOB_COSTS_KEPT}"))
    assert api.reads.count(f"job_{JOB_COSTS_KEPT}") == 1
    console.job_cost(job("job_0"))  # the oldest went
    assert api.reads.count("job_0") == 2
