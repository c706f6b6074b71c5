"""GET /jobs: filters, time ranges, queued jobs in run order with their position and reason."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime, timedelta

import pytest

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.aws import client
from relevo_core.jobs.listing import list_jobs
from relevo_core.models.requests import JobListQuery
from tests.helpers.stack import receive_stage, register_project, wait_for_execution
from tests.helpers.state_machine import agent_runs, claim_and_accept, start_job

STAGES = [{"name": "build", "run": "true"}]


def _wait_for(predicate, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError("condition not reached")


@pytest.fixture
def api(local_stack):
    return RelevoApi.for_stack(local_stack)


def _run(api, project_id, **body):
    return api.run_project(project_id, {"ref": "main", "request_id": secrets.token_hex(4), **body})["job_id"]


def test_queued_jobs_are_listed_in_run_order_with_position_and_reason(local_stack, api, project_id):
    register_project(local_stack, project_id, STAGES)
    holder = _run(api, project_id)
    # The first job holds the project (its stage waits for an agent); the rest queue behind it.
    receive_stage(local_stack, holder)
    low = _run(api, project_id, priority=1)
    high = _run(api, project_id, priority=5)
    also_low = _run(api, project_id, priority=1)
    try:
        listing = _wait_for(
            lambda: (page := api.list_jobs(project=project_id, status="queued"))["count"] == 3
            and all(job["queue_reason"] == "project_running" for job in page["jobs"])
            and page
        )
        assert [job["job_id"] for job in listing["jobs"]] == [high, low, also_low]
        assert [job["queue_position"] for job in listing["jobs"]] == [1, 2, 3]
        assert {job["status"] for job in listing["jobs"]} == {"queued"}
        # Newest first without a status filter; the running holder is there too.
        everything = api.list_jobs(project=project_id)
        assert [job["job_id"] for job in everything["jobs"]] == [also_low, high, low, holder]
        assert everything["count"] == 4 and not everything["truncated"]
        assert "queue_position" not in everything["jobs"][0]
    finally:
        for job_id in (also_low, high, low, holder):
            api.cancel_job(job_id)


def test_filters_combine_and_limit_truncates(local_stack, api, project_id):
    register_project(local_stack, project_id, STAGES)
    other = f"{project_id}-b"
    register_project(local_stack, other, STAGES)
    manual = _run(api, project_id, trigger="manual")
    scripted = _run(api, project_id)
    elsewhere = _run(api, other, trigger="manual")
    try:
        assert [j["job_id"] for j in api.list_jobs(project=project_id, trigger="manual")["jobs"]] == [manual]
        assert [j["job_id"] for j in api.list_jobs(project=project_id, trigger="api")["jobs"]] == [scripted]
        assert api.list_jobs(project=project_id, region="us-east")["count"] == 0
        assert api.list_jobs(project=project_id, region="eu-west")["count"] == 2
        page = api.list_jobs(project=project_id, limit=1)
        assert page["count"] == 1 and page["truncated"] and page["jobs"][0]["job_id"] == scripted
        # A time range that ends before these jobs existed holds none of them.
        before = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
        assert api.list_jobs(project=project_id, until=before)["count"] == 0
        assert api.list_jobs(project=project_id, since=before)["count"] == 2
        # Across projects (no project filter), both projects' jobs are found.
        ids = {j["job_id"] for j in api.list_jobs(trigger="manual", limit=500)["jobs"]}
        assert {manual, elsewhere} <= ids and scripted not in ids
    finally:
        for job_id in (manual, scripted, elsewhere):
            api.cancel_job(job_id)


def test_group_and_keyword_filters_read_the_projects_index(local_stack, api, project_id):
    group = f"g-{secrets.token_hex(3)}"
    register_project(local_stack, project_id, STAGES, group=group)
    other = f"{project_id}-b"
    register_project(local_stack, other, STAGES, group=group)
    outside = f"{project_id}-c"
    register_project(local_stack, outside, STAGES)
    first = _run(api, project_id, ref="release/2.4")
    second = _run(api, other)
    third = _run(api, outside, ref="release/2.4")
    try:
        assert api.get_project(project_id)["group"] == group
        in_group = api.list_jobs(group=group)["jobs"]
        assert {job["job_id"] for job in in_group} == {first, second}
        # Group and project combine with AND; an unknown group has no jobs rather than all of them.
        assert [job["job_id"] for job in api.list_jobs(group=group, project=other)["jobs"]] == [second]
        assert api.list_jobs(group=f"{group}-none")["count"] == 0
        # The keyword is a case-insensitive part of the ref, the job id or the project.
        assert {job["job_id"] for job in api.list_jobs(q="RELEASE/2.4", limit=500)["jobs"]} >= {first, third}
        assert second not in {job["job_id"] for job in api.list_jobs(q="release/2.4", limit=500)["jobs"]}
        assert [job["job_id"] for job in api.list_jobs(project=project_id, q=first[-6:])["jobs"]] == [first]
        assert [job["job_id"] for job in api.list_jobs(group=group, q="release")["jobs"]] == [first]
    finally:
        for job_id in (first, second, third):
            api.cancel_job(job_id)


def test_a_live_listing_reads_the_live_jobs_and_none_of_the_ended_ones(local_stack, api, project_id):
    """GET /queue and GET /jobs?status=queued|running read the JobStatusIndex: what they cost is
    the live jobs, however many ended jobs the projects keep (it once read every job of every
    project, and GET /queue timed out on a busy stack)."""
    register_project(local_stack, project_id, STAGES)
    ended = [_run(api, project_id) for _ in range(4)]
    for job_id in ended:
        api.cancel_job(job_id)
    live = _run(api, project_id)
    read: list[int] = []

    def count_items(parsed, **_):
        read.append(len(parsed.get("Items", [])))

    dynamodb = client("dynamodb")
    dynamodb.meta.events.register("after-call.dynamodb.Query", count_items)
    try:
        status = _wait_for(
            lambda: {j: api.get_job(j)["status"] for j in ended} == dict.fromkeys(ended, "canceled")
            and api.get_job(live)["status"]
        )
        listing = list_jobs(local_stack.table_name, JobListQuery(status=status, project=project_id))
        assert [job["job_id"] for job in listing["jobs"]] == [live]
        assert sum(read) == 1  # the one live job: no ended job was read
        del read[:]
        everything = list_jobs(local_stack.table_name, JobListQuery(status=status, limit=500))
        assert not everything["truncated"] and live in {job["job_id"] for job in everything["jobs"]}
        assert not set(ended) & {job["job_id"] for job in everything["jobs"]}
        assert sum(read) == everything["count"]  # across projects too: only jobs in that status
    finally:
        dynamodb.meta.events.unregister("after-call.dynamodb.Query", count_items)
        api.cancel_job(live)


def test_agent_filter_finds_jobs_an_agent_claimed(local_stack, api, project_id):
    register_project(local_stack, project_id, STAGES)
    job_id = _run(api, project_id)
    try:
        task, _ = receive_stage(local_stack, job_id)
        agent = f"mac-{secrets.token_hex(3)}"
        claim_and_accept(local_stack, task, agent)
        assert [j["job_id"] for j in api.list_jobs(project=project_id, agent=agent)["jobs"]] == [job_id]
        assert api.list_jobs(project=project_id, agent="someone-else")["count"] == 0
    finally:
        api.cancel_job(job_id)


@pytest.mark.parametrize(
    "params",
    [
        {"status": "sleeping"},
        {"limit": "0"},
        {"since": "yesterday"},
        {"colour": "blue"},
        {"q": ""},
        {"group": "x" * 65},
    ],
)
def test_bad_filters_are_refused_with_a_code(api, params):
    with pytest.raises(ApiError) as refused:
        api.request("GET", "/jobs", params=params)
    assert refused.value.status == 422
    assert refused.value.body["error"] == "VALIDATION_FAILED"


def test_agent_filter_finds_a_job_whose_failed_attempt_ran_on_the_agent(local_stack, api, project_id):
    # attempts_log entries are written by job.asl.json as {attempt, agent, error, cause, at}
    job_id = start_job(
        local_stack, project_id, stages=[{"name": "upload", "run": "true"}], retry={"backoff_base_sec": 0}
    )
    first, _ = receive_stage(local_stack, job_id)
    agent_runs(
        local_stack, first, succeed=False, agent_id=f"{project_id}-mac-a", error="Relevo.Transient.ExitCode"
    )
    second, _ = receive_stage(local_stack, job_id, timeout=20)
    agent_runs(local_stack, second, agent_id=f"{project_id}-mac-b")
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    for agent in (f"{project_id}-mac-a", f"{project_id}-mac-b"):
        assert [j["job_id"] for j in api.list_jobs(project=project_id, agent=agent)["jobs"]] == [job_id], (
            agent
        )
