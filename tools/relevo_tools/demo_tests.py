"""`make demo`'s test-results scenario: a real project's tests (examples/demo/peer-tests.yaml:
more-itertools' tests/test_more.py from its PyPI sdist, relevo_local.peer_suite) in 4 shards, run
twice -- split by count, then by the times the first job measured -- each job's tests accounted
for exactly once through GET /jobs/{id}/tests, and where its Tests tab is."""

from __future__ import annotations

import os

from relevo_local.processes import random_commit
from relevo_tools.demo_harness import Demo, ScenarioResult, expect, stage
from relevo_tools.peer_suite import accounted, all_tests, balance

PROJECT = "peer-tests"
SCENARIO = "a real suite in 4 shards, split by time"
# The console `RELEVO_DEMO_KEEP=1 make demo` serves (relevo_tools.demo.keep_running).
CONSOLE_PORT = int(os.environ.get("RELEVO_DEMO_CONSOLE_PORT", "8765"))


def tests_tab(job_id: str) -> str:
    return f"http://127.0.0.1:{CONSOLE_PORT}/jobs/{job_id}/tests"


def scenario_peer_tests(demo: Demo) -> ScenarioResult:
    tag = "tests"
    evidence = []
    splits = []
    job_id = ""
    for number in (1, 2):
        job_id = demo.run(PROJECT, random_commit())
        demo.say(tag, f"{PROJECT} run {number} → job {job_id}")
        job = demo.watch(tag, job_id, timeout=180)
        expect(job["status"] == "succeeded", f"job ended {job['status']}: {job.get('error')}")
        counts = demo.api.job_tests(job_id, limit=1)["counts"]
        tests = all_tests(demo.api, job_id)
        ids, twice = accounted(tests)
        planned = sum(part["tests"] for part in stage(job, "test")["test_plan"]["shards"])
        expect(
            counts["total"] == planned == len(ids) == len(tests) and not twice,
            f"{planned} tests planned, the API counts {counts['total']} and lists {len(tests)} "
            f"({len(ids)} distinct, {len(twice)} more than once)",
        )
        split = balance(demo.api, job)
        splits.append(split)
        line = (
            f"job {number}: {counts['total']} tests, {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped, each accounted once; {split.said()}"
        )
        demo.say(tag, line)
        evidence.append(line)
    expect(
        [split.by for split in splits] == ["count", "time"],
        f"the jobs were split by {[split.by for split in splits]}, not by count then by time",
    )
    where = f"Tests tab: {tests_tab(job_id)} (served by `RELEVO_DEMO_KEEP=1 make demo`, once signed in)"
    demo.say(tag, where)
    evidence.append(where)
    return ScenarioResult(SCENARIO, True, evidence)
