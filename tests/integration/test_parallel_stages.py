"""A stage with shards in statemachines/job.asl.json, executing in the emulator's Step Functions
interpreter: each shard dispatched as a stage attempt of its own (its own record, dispatch key,
claim and run token), the stage succeeding once every shard did; fail-fast stopping the
siblings through their records; fail_fast false letting them finish; the DLQ naming the shards
that failed. Driven by an agent double that makes the real SQS, DynamoDB and task-token calls."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

import pytest

from bench.cost import TRANSITIONS_PER_FAN_OUT_BUDGET, TRANSITIONS_PER_SHARD_BUDGET
from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store import keys, stage_attempts
from tests.helpers.stack import history, job_items, wait_for_execution, wait_until
from tests.helpers.state_machine import agent_runs, start_job, wait_for_run_token

BUILD = {"name": "build", "run": "make build"}


def stage_messages(stack, job_id: str, count: int, timeout: float = 15) -> list[dict[str, Any]]:
    """The next `count` stage messages of the job in the region's queue (other jobs' are dropped),
    in shard order."""
    sqs, found = client("sqs"), []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=stack.work_queues["eu-west"], WaitTimeSeconds=1, MaxNumberOfMessages=10).get("Messages", []):
            body = json.loads(message["Body"])
            if body["job_id"] == job_id:
                found.append(body)
            sqs.delete_message(QueueUrl=stack.work_queues["eu-west"], ReceiptHandle=message["ReceiptHandle"])
    assert len(found) == count, f"{len(found)} of {count} stage messages"
    return sorted(found, key=lambda body: body.get("shard", -1))


def claim_shard(stack, task: dict[str, Any], agent_id: str) -> tuple[stage_attempts.StageRef, str]:
    """Claim one shard's attempt (fenced, on its own record), accept it, and wait for its run token."""
    ref = stage_attempts.StageRef(stack.table_name, task["job_id"], task["stage_index"], task["attempt"], agent_id, shard=task["shard"])
    stage_attempts.claim(ref, 10, datetime.now(timezone.utc))
    client("stepfunctions").send_task_success(taskToken=task["task_token"], output=json.dumps({"agent_id": agent_id, "attempt": task["attempt"]}))
    return ref, wait_for_run_token(ref)


def report(ref: stage_attempts.StageRef, run_token: str, succeed: bool, error: str = "Relevo.Fatal.ExitCode") -> None:
    sfn, now = client("stepfunctions"), datetime.now(timezone.utc)
    if succeed:
        stage_attempts.finish(ref, StageStatus.SUCCEEDED, now, 0, None)
        sfn.send_task_success(taskToken=run_token, output=json.dumps({"agent_id": ref.agent_id, "stage": "test", "status": "succeeded"}))
    else:
        stage_attempts.finish(ref, StageStatus.FAILED, now, 2, error)
        sfn.send_task_failure(taskToken=run_token, error=error, cause=json.dumps({"exit_code": 2, "agent_id": ref.agent_id}))


def records(stack, job_id: str) -> dict[str, dict[str, Any]]:
    return {item["sk"]["S"]: item for item in job_items(stack, job_id)}


def dead_letter(stack, job_id: str) -> dict[str, Any]:
    for _ in range(20):
        for message in client("sqs").receive_message(QueueUrl=stack.resources["JobDeadLetterQueue"], MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []):
            body = json.loads(message["Body"])
            if body["job_id"] == job_id:
                return body
    raise AssertionError(f"no dead letter for {job_id}")


def test_four_shards_each_run_once_as_an_attempt_of_their_own_and_the_stage_succeeds_after_all(local_stack, project_id):
    job_id = start_job(local_stack, project_id, [BUILD, {"name": "test", "run": "make test", "parallel": 4}])
    agent_runs(local_stack, stage_messages(local_stack, job_id, 1)[0])

    tasks = stage_messages(local_stack, job_id, 4)

    assert [(task["stage"], task["stage_index"], task["shard"], task["attempt"]) for task in tasks] == [("test", 1, shard, 1) for shard in range(4)]
    assert len({task["dispatch_key"] for task in tasks}) == 4
    runs = [claim_shard(local_stack, task, f"mac-{task['shard']}") for task in tasks]
    for ref, token in runs:
        report(ref, token, succeed=True)

    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    found = records(local_stack, job_id)
    shard_keys = [keys.shard_sk(1, shard) for shard in range(4)]
    assert shard_keys == ["STAGE#01#SHARD#00", "STAGE#01#SHARD#01", "STAGE#01#SHARD#02", "STAGE#01#SHARD#03"]
    assert [(found[key]["status"]["S"], found[key]["agent_id"]["S"], found[key]["shard_index"]["N"]) for key in shard_keys] == [
        ("succeeded", f"mac-{shard}", str(shard)) for shard in range(4)
    ]
    assert (found["STAGE#01"]["status"]["S"], found["STAGE#01"]["shard_count"]["N"]) == ("succeeded", "4")
    assert found["JOB"]["last_successful_stage"]["S"] == "test"
    assert json.loads(found["JOB"]["stage_outcomes"]["S"])[1] == {"stage": "test", "status": "succeeded", "shards": 4}
    entered = [e["stateEnteredEventDetails"]["name"] for e in history(local_stack, job_id) if e["type"].endswith("StateEntered")]
    print(f"\nstate transitions: {len(entered)} for a stage and a stage of 4 shards: {' > '.join(entered)}")
    # bench/cost.py's budget: 3 per shard, as a stage without shards, and 7 for the fan-out.
    assert len(entered[5:-1]) == 4 * TRANSITIONS_PER_SHARD_BUDGET + TRANSITIONS_PER_FAN_OUT_BUDGET
    assert entered[5:] == ["MarkStageDispatched", "GatedOrSharded", "StartShards", "RunShards",
                           *(["ShardMarkStageDispatched"] * 4), *(["ShardDispatchStage"] * 4), *(["ShardAwaitResult"] * 4),
                           "AnyShardFailed", "RecordShardsSucceeded", "ShardsSucceeded", "ReleaseLockAndMarkSucceeded"]


def test_fail_fast_stops_the_running_siblings_through_their_records_and_the_dead_letter_names_the_shard(local_stack, project_id):
    job_id = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 3}])
    runs = [claim_shard(local_stack, task, f"mac-{task['shard']}") for task in stage_messages(local_stack, job_id, 3)]

    report(*runs[1], succeed=False)

    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    found = records(local_stack, job_id)
    assert [found[keys.shard_sk(0, shard)]["status"]["S"] for shard in range(3)] == ["canceled", "failed", "canceled"]
    assert all("closed_at" in found[keys.shard_sk(0, shard)] for shard in range(3))
    # The siblings' agents learn it at their next fenced write, and stop their commands.
    with pytest.raises(stage_attempts.LeaseLost):
        stage_attempts.renew_lease(runs[0][0], 10, datetime.now(timezone.utc))
    assert found["STAGE#00"]["status"]["S"] == "failed"
    entry = dead_letter(local_stack, job_id)
    detail = json.loads(entry["cause"])
    assert (entry["error"], detail["stage"], detail["shard"], detail["attempts"]) == ("Relevo.Fatal.ExitCode", "test", 1, 1)


def test_without_fail_fast_the_siblings_finish_then_the_stage_fails_naming_each_failed_shard(local_stack, project_id):
    job_id = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 3, "fail_fast": False}])
    runs = [claim_shard(local_stack, task, f"mac-{task['shard']}") for task in stage_messages(local_stack, job_id, 3)]

    report(*runs[0], succeed=False)
    report(*runs[2], succeed=False, error="Relevo.Fatal.Checksum")
    wait_until(lambda: records(local_stack, job_id)[keys.shard_sk(0, 2)]["status"]["S"] == "failed", 10, "the third shard's failure")
    report(*runs[1], succeed=True)

    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    found = records(local_stack, job_id)
    assert [found[keys.shard_sk(0, shard)]["status"]["S"] for shard in range(3)] == ["failed", "succeeded", "failed"]
    entry = dead_letter(local_stack, job_id)
    failed = [json.loads(failure["Cause"]) for failure in json.loads(entry["cause"])]
    assert sorted((f["shard"], f["error_class"]) for f in failed) == [(0, "Relevo.Fatal.ExitCode"), (2, "Relevo.Fatal.Checksum")]


def test_without_fail_fast_one_failed_shard_fails_the_stage_with_its_own_error(local_stack, project_id):
    """One failure among the shards: moto's JSONPath reads `$[*].failed.Error` of a single match as
    the string itself where AWS gives a one-item list, so the error is read off the first failure
    (an intrinsic, then a plain path), which both read alike."""
    job_id = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 2, "fail_fast": False}])
    runs = [claim_shard(local_stack, task, f"mac-{task['shard']}") for task in stage_messages(local_stack, job_id, 2)]

    report(*runs[1], succeed=False, error="Relevo.Fatal.Checksum")
    report(*runs[0], succeed=True)

    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    entry = dead_letter(local_stack, job_id)
    assert entry["error"] == "Relevo.Fatal.Checksum"
    assert [json.loads(failure["Cause"])["shard"] for failure in json.loads(entry["cause"])] == [1]


def test_the_claim_route_claims_each_shard_on_its_own_record_and_refuses_a_message_without_its_shard(local_stack, project_id, tmp_path):
    """The route the agents claim through: a shard's message (its shard and dispatch key) claims
    that shard's record only; the same dispatch key without the shard names the stage's own record,
    which was never dispatched, so nothing is claimed; the session renews on the shard's record."""
    from relevo_agent.claim import new_claim_secret
    from relevo_agent.claim_routes import RouteError
    from relevo_agent.config import AgentConfig
    from relevo_agent.service import Agent
    from relevo_core.models.agent_session import ClaimRequest, SessionRequest

    config = AgentConfig(agent_id="mac-s", region="eu-west", capacity=1, workspace_root=tmp_path / "ws",
                         journal=tmp_path / "j.sqlite3", max_clock_skew_sec=0.5, prefer_previous_sec=0, handoff_max_wait_sec=0)
    routes = Agent(config, local_stack.table_name, local_stack.work_queues["eu-west"], api_url=local_stack.api_url).sessions.routes
    job_id = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 2}])
    tasks = stage_messages(local_stack, job_id, 2)

    def request(task: dict[str, Any], agent_id: str, **changed: Any) -> ClaimRequest:
        fields = {"job_id": job_id, "stage_index": 0, "shard": task["shard"], "attempt": 1, "agent_id": agent_id,
                  "claim_secret": new_claim_secret(), "dispatch_key": task["dispatch_key"], "dispatch_token": task["task_token"],
                  "project": project_id, "signs": False}
        return ClaimRequest(**(fields | changed))

    with pytest.raises(RouteError) as refused:
        routes.claim(request(tasks[0], "mac-a", shard=None))
    assert (refused.value.status, refused.value.code) == (404, "DISPATCH_NOT_FOUND")
    with pytest.raises(RouteError) as refused:
        routes.claim(request(tasks[0], "mac-a", shard=1))  # shard 1's record, shard 0's dispatch key
    assert (refused.value.status, refused.value.code) == (404, "DISPATCH_NOT_FOUND")
    claims = [request(task, f"mac-{task['shard']}") for task in tasks]
    for claim in claims:
        assert routes.claim(claim).accepted is True

    found = records(local_stack, job_id)
    assert [(found[keys.shard_sk(0, shard)]["agent_id"]["S"], found[keys.shard_sk(0, shard)]["status"]["S"]) for shard in range(2)] == [
        ("mac-0", "running"), ("mac-1", "running")
    ]
    assert "agent_id" not in found["STAGE#00"]
    renewed = routes.renew(SessionRequest(job_id=job_id, stage_index=0, shard=1, attempt=1, agent_id="mac-1",
                                          claim_secret=claims[1].claim_secret))
    assert renewed.access_key_id
    for claim in claims:
        ref = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, claim.agent_id, shard=claim.shard)
        report(ref, wait_for_run_token(ref), succeed=True)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"


def test_cancel_stops_every_running_shard(local_stack, project_id):
    """A job canceled while its shards run: every shard record ends canceled and closed, so each
    agent's next fenced renewal is refused and it kills its command's process group."""
    from relevo_cli.api import RelevoApi

    job_id = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 3}])
    runs = [claim_shard(local_stack, task, f"mac-{task['shard']}") for task in stage_messages(local_stack, job_id, 3)]

    assert RelevoApi.for_stack(local_stack).cancel_job(job_id)["status"] == "canceled"

    found = records(local_stack, job_id)
    assert [(found[keys.shard_sk(0, shard)]["status"]["S"], "closed_at" in found[keys.shard_sk(0, shard)]) for shard in range(3)] == [
        ("canceled", True)
    ] * 3
    for ref, _ in runs:
        with pytest.raises(stage_attempts.LeaseLost):
            stage_attempts.renew_lease(ref, 10, datetime.now(timezone.utc))
    assert wait_for_execution(local_stack, job_id, timeout=30)["status"] != "RUNNING"


def test_a_gated_stage_with_shards_waits_for_its_approval_then_fans_out(local_stack, project_id):
    from relevo_cli.api import RelevoApi

    job_id = start_job(local_stack, project_id, [BUILD, {"name": "deploy", "run": "make deploy", "parallel": 2}], approval={"enabled": True})
    agent_runs(local_stack, stage_messages(local_stack, job_id, 1)[0])
    wait_until(lambda: records(local_stack, job_id)["JOB"]["status"]["S"] == "waiting", 10, "the approval wait")
    assert records(local_stack, job_id)["JOB"]["waiting_stage"]["S"] == "deploy"

    RelevoApi.for_stack(local_stack).approve(job_id, "shipped")

    runs = [claim_shard(local_stack, task, f"mac-{task['shard']}") for task in stage_messages(local_stack, job_id, 2)]
    for ref, token in runs:
        report(ref, token, succeed=True)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    found = records(local_stack, job_id)
    assert found["STAGE#01"]["approved_at"]["S"] and found["STAGE#01"]["status"]["S"] == "succeeded"


def test_a_matrix_of_two_by_two_runs_on_four_agents_each_shard_once_with_its_own_variables(local_stack, project_id, tmp_path):
    """Real agents (in process): each claims one shard through the claim route, runs its command
    with RELEVO_SHARD_INDEX / RELEVO_SHARD_COUNT / RELEVO_MATRIX_<KEY> and an operation id of its
    own, and reports on its shard's record; the stage succeeds once all four did."""
    from relevo_agent.config import AgentConfig
    from relevo_agent.messages import Message
    from relevo_agent.service import Agent
    from tests.helpers.agents import handle_received

    seen = tmp_path / "seen"
    seen.mkdir()
    job_id = start_job(local_stack, project_id, [{
        "name": "test", "matrix": {"device": ["iPhone 16", "iPad Air"], "os": ["18.2", "17.5"]},
        "run": f'env | grep ^RELEVO_ | sort > "{seen}/$RELEVO_SHARD_INDEX.env"',
    }])
    tasks = stage_messages(local_stack, job_id, 4)

    for task in tasks:
        name = f"mac-{task['shard']}"
        config = AgentConfig(agent_id=name, region="eu-west", capacity=1, workspace_root=tmp_path / name, journal=tmp_path / f"{name}.sqlite3",
                             max_clock_skew_sec=0.5, prefer_previous_sec=0, handoff_max_wait_sec=0)
        agent = Agent(config, local_stack.table_name, local_stack.work_queues["eu-west"], api_url=local_stack.api_url)
        handle_received(agent, Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": "gone", "MessageId": name}))
        assert agent.sessions.held() == []

    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    combinations = [("iPhone 16", "18.2"), ("iPhone 16", "17.5"), ("iPad Air", "18.2"), ("iPad Air", "17.5")]
    operations = set()
    for shard, (device, os_version) in enumerate(combinations):
        env = dict(line.split("=", 1) for line in (seen / f"{shard}.env").read_text().splitlines())
        assert (env["RELEVO_SHARD_INDEX"], env["RELEVO_SHARD_COUNT"], env["RELEVO_MATRIX_DEVICE"], env["RELEVO_MATRIX_OS"]) == (
            str(shard), "4", device, os_version)
        operations.add(env["RELEVO_OPERATION_ID"])
    assert operations == {f"{job_id}:test#shard-{shard}" for shard in range(4)}
    found = records(local_stack, job_id)
    assert [(found[keys.shard_sk(0, shard)]["status"]["S"], found[keys.shard_sk(0, shard)]["agent_id"]["S"]) for shard in range(4)] == [
        ("succeeded", f"mac-{shard}") for shard in range(4)
    ]


def test_a_shard_failing_transiently_is_retried_alone_on_its_own_record(local_stack, project_id):
    """Retries by error class per shard: shard 0's transient failure dispatches its attempt 2
    (its record, its message, naming the agent to avoid); shard 1 runs once."""
    job_id = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 2}], retry={"backoff_base_sec": 0})
    runs = [claim_shard(local_stack, task, f"mac-{task['shard']}") for task in stage_messages(local_stack, job_id, 2)]

    report(*runs[0], succeed=False, error="Relevo.Transient.ExitCode")
    [retry] = stage_messages(local_stack, job_id, 1)

    assert (retry["shard"], retry["attempt"], retry["avoid_agents"]) == (0, 2, ["mac-0"])
    report(*claim_shard(local_stack, retry, "mac-2"), succeed=True)
    report(*runs[1], succeed=True)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    found = records(local_stack, job_id)
    first, second = found[keys.shard_sk(0, 0)], found[keys.shard_sk(0, 1)]
    assert (first["attempt"]["N"], first["agent_id"]["S"], first["retry_count"]["N"]) == ("2", "mac-2", "1")
    assert [entry["M"]["error"]["S"] for entry in first["attempts_log"]["L"]] == ["Relevo.Transient.ExitCode"]
    assert (second["attempt"]["N"], "attempts_log" in second) == ("1", False)


def test_the_job_view_says_why_each_unclaimed_shard_waits(local_stack, project_id):
    """The one agent meeting the stage's `requires` (a label of its own) is full: the shard not
    claimed yet waits with agent_busy, named in `waiting_shards`, in the job's own reason and in
    the queue's rows; once the agent has a free slot, the shard is about to be claimed (no reason)."""
    from relevo_core.jobs.queue import queue_view
    from relevo_core.jobs.view import show_job
    from relevo_core.models.capabilities import Capabilities
    from relevo_core.store import agents

    pool = f"pool-{project_id}"
    job_id = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 2, "requires": {"pool": pool}}])
    first, _ = stage_messages(local_stack, job_id, 2)
    claim_shard(local_stack, first, "mac-0")

    def presence(running: int) -> None:
        agents.put_presence(local_stack.table_name, agents.AgentPresence(
            agent_id=f"mac-{pool}", region="eu-west", capacity=1, running=running, version="0.1.0", last_seen=datetime.now(timezone.utc),
            interval_sec=30, capabilities=Capabilities(os="darwin", arch="arm64", labels={"pool": pool})))

    presence(running=1)
    view = show_job(local_stack.table_name, job_id, datetime.now(timezone.utc))
    assert view["waiting_shards"] == [{"stage": "test", "shard": 1, "attempt": 1, "queue_reason": "agent_busy", "queue_detail": None}]
    assert (view["queue_reason"], view["stages"][0]["status"]) == ("agent_busy", "running")
    # The queue (GET /queue, relevo queue) lists the shard as waiting for an agent, and why.
    queue = queue_view(local_stack.table_name, ("eu-west",), lambda project: True, datetime.now(timezone.utc))
    assert [(row["stage"], row["shard"], row["queue_reason"]) for row in queue["waiting_for_agent"] if row["job_id"] == job_id] == [
        ("test", 1, "agent_busy")]

    presence(running=0)
    view = show_job(local_stack.table_name, job_id, datetime.now(timezone.utc))
    assert [(shard["shard"], shard["queue_reason"]) for shard in view["waiting_shards"]] == [(1, None)]
    assert view["queue_reason"] is None
