"""A retry names the agents that ran the failed attempts (job.asl.json on the embedded stack, an
agent double making the real calls), so relevo-agent can leave it to another agent."""

from __future__ import annotations

from relevo_core.store.codec import from_attributes
from tests.helpers.stack import job_items, receive_stage, wait_for_execution
from tests.helpers.state_machine import agent_runs, claim_and_accept, start_job, wait_for_run_token


def _stage(stack, job_id):
    return next(from_attributes(i) for i in job_items(stack, job_id) if i["sk"]["S"] == "STAGE#00")


def test_each_retry_carries_the_agents_of_the_failed_attempts(local_stack, project_id):
    job_id = start_job(
        local_stack,
        project_id,
        stages=[{"name": "upload", "run": "true"}],
        retry={"backoff_base_sec": 0},
        queue_timeout_sec=40,
    )
    first, _ = receive_stage(local_stack, job_id)
    # A first attempt avoids nobody; every dispatch tells agents its queue timeout.
    assert (first["attempt"], first["avoid_agents"], first["queue_timeout_sec"]) == (1, [], 40)
    agent_runs(local_stack, first, succeed=False, agent_id="mac-a", error="Relevo.Transient.ExitCode")

    second, _ = receive_stage(local_stack, job_id, timeout=20)
    assert (second["attempt"], second["avoid_agents"]) == (2, ["mac-a"])
    agent_runs(local_stack, second, succeed=False, agent_id="mac-b", error="Relevo.Transient.NetworkTimeout")

    third, _ = receive_stage(local_stack, job_id, timeout=20)
    assert (third["attempt"], third["avoid_agents"]) == (3, ["mac-a", "mac-b"])
    agent_runs(local_stack, third, agent_id="mac-c")

    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    stage = _stage(local_stack, job_id)
    # Each attempt's agent and error are recorded on the stage.
    assert [(a["attempt"], a["agent"], a["error"]) for a in stage["attempts_log"]] == [
        (1, "mac-a", "Relevo.Transient.ExitCode"),
        (2, "mac-b", "Relevo.Transient.NetworkTimeout"),
    ]
    assert (stage["agent_id"], stage["attempt"], stage["failed_agents"]) == ("mac-c", 3, ["mac-a", "mac-b"])


def test_a_lost_lease_makes_the_retry_avoid_the_silent_agent(local_stack, project_id):
    job_id = start_job(
        local_stack,
        project_id,
        stages=[{"name": "sign", "run": "true"}],
        lease_ttl_sec=3,
        retry={"backoff_base_sec": 0},
    )
    task, _ = receive_stage(local_stack, job_id)
    wait_for_run_token(claim_and_accept(local_stack, task, "mac-silent", lease_ttl_sec=3))  # ...then silence

    retry, _ = receive_stage(local_stack, job_id, timeout=30)

    assert (retry["attempt"], retry["avoid_agents"]) == (2, ["mac-silent"])
    assert [(a["agent"], a["error"]) for a in _stage(local_stack, job_id)["attempts_log"]] == [
        ("mac-silent", "Relevo.Lease.Expired")
    ]
    agent_runs(local_stack, retry, agent_id="mac-alive")
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
