"""A stage with shards in statemachines/job.asl.json, executing in the emulator's Step Functions
interpreter: each shard dispatched as a stage attempt of its own (its own record, dispatch key,
claim and run token), the stage succeeding once every shard did; fail-fast stopping the
siblings through their records; fail_fast false letting them finish; the DLQ naming the shards
that failed. Driven by an agent double that makes the real SQS, DynamoDB and task-token calls."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import pytest

from bench.cost import TRANSITIONS_PER_FAN_OUT_BUDGET, TRANSITIONS_PER_SHARD_BUDGET
from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.store import keys, stage_attempts, stage_claims
from relevo_core.store.codec import from_attributes
from tests.helpers.agents import agent_at
from tests.helpers.iam import client_as
from tests.helpers.stack import history, job_execution_arn, job_items, wait_for_execution, wait_until
from tests.helpers.state_machine import agent_runs, start_job, wait_for_run_token
from tests.helpers.tree import tree_listing

BUILD = {"name": "build", "run": "make build"}


def stage_messages(stack, job_id: str, count: int, timeout: float = 15) -> list[dict[str, Any]]:
    """The next `count` stage messages of the job in the region's queue (other jobs' are dropped),
    in shard order."""
    sqs, found = client("sqs"), []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        for message in sqs.receive_message(
            QueueUrl=stack.work_queues["eu-west"], WaitTimeSeconds=1, MaxNumberOfMessages=10
        ).get("Messages", []):
            body = json.loads(message["Body"])
            if body["job_id"] == job_id:
                found.append(body)
            sqs.delete_message(QueueUrl=stack.work_queues["eu-west"], ReceiptHandle=message["ReceiptHandle"])
    assert len(found) == count, f"{len(found)} of {count} stage messages"
    return sorted(found, key=lambda body: body.get("shard", -1))


def claim_shard(stack, task: dict[str, Any], agent_id: str) -> tuple[stage_attempts.StageRef, str]:
    """Claim one shard's attempt (fenced, on its own record), accept it, and wait for its run token."""
    ref = stage_attempts.StageRef(
        stack.table_name, task["job_id"], task["stage_index"], task["attempt"], agent_id, shard=task["shard"]
    )
    stage_claims.claim(ref, 10, datetime.now(UTC))
    client("stepfunctions").send_task_success(
        taskToken=task["task_token"], output=json.dumps({"agent_id": agent_id, "attempt": task["attempt"]})
    )
    return ref, wait_for_run_token(ref)


def report(
    ref: stage_attempts.StageRef,
    run_token: str,
    succeed: bool,
    error: str = "Relevo.Fatal.ExitCode",
    status: StageStatus = StageStatus.SUCCEEDED,
) -> None:
    sfn, now = client("stepfunctions"), datetime.now(UTC)
    if succeed:
        stage_attempts.finish(ref, status, now, 0, None)
        sfn.send_task_success(
            taskToken=run_token,
            output=json.dumps({"agent_id": ref.agent_id, "stage": "test", "status": status.value}),
        )
    else:
        stage_attempts.finish(ref, StageStatus.FAILED, now, 2, error)
        sfn.send_task_failure(
            taskToken=run_token, error=error, cause=json.dumps({"exit_code": 2, "agent_id": ref.agent_id})
        )


def records(stack, job_id: str) -> dict[str, dict[str, Any]]:
    return {item["sk"]["S"]: item for item in job_items(stack, job_id)}


def dead_letter(stack, job_id: str) -> dict[str, Any]:
    for _ in range(20):
        for message in (
            client("sqs")
            .receive_message(
                QueueUrl=stack.resources["JobDeadLetterQueue"], MaxNumberOfMessages=10, WaitTimeSeconds=1
            )
            .get("Messages", [])
        ):
            body = json.loads(message["Body"])
            if body["job_id"] == job_id:
                return body
    raise AssertionError(f"no dead letter for {job_id}")


def test_four_shards_each_run_once_as_an_attempt_of_their_own_and_the_stage_succeeds_after_all(
    local_stack, project_id
):
    job_id = start_job(local_stack, project_id, [BUILD, {"name": "test", "run": "make test", "parallel": 4}])
    agent_runs(local_stack, stage_messages(local_stack, job_id, 1)[0])

    tasks = stage_messages(local_stack, job_id, 4)

    assert [(task["stage"], task["stage_index"], task["shard"], task["attempt"]) for task in tasks] == [
        ("test", 1, shard, 1) for shard in range(4)
    ]
    assert len({task["dispatch_key"] for task in tasks}) == 4
    runs = [claim_shard(local_stack, task, f"mac-{task['shard']}") for task in tasks]
    for ref, token in runs:
        report(ref, token, succeed=True)

    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    found = records(local_stack, job_id)
    shard_keys = [keys.shard_sk(1, shard) for shard in range(4)]
    assert shard_keys == ["STAGE#01#SHARD#00", "STAGE#01#SHARD#01", "STAGE#01#SHARD#02", "STAGE#01#SHARD#03"]
    assert [
        (found[key]["status"]["S"], found[key]["agent_id"]["S"], found[key]["shard_index"]["N"])
        for key in shard_keys
    ] == [("succeeded", f"mac-{shard}", str(shard)) for shard in range(4)]
    assert (found["STAGE#01"]["status"]["S"], found["STAGE#01"]["shard_count"]["N"]) == ("succeeded", "4")
    assert found["JOB"]["last_successful_stage"]["S"] == "test"
    outcome = json.loads(found["JOB"]["stage_outcomes"]["S"])[1]
    assert (outcome["stage"], outcome["status"], outcome["shards"]) == ("test", "succeeded", 4)
    assert [answer["agent_id"] for answer in outcome["shard_outcomes"]] == [
        f"mac-{shard}" for shard in range(4)
    ]
    entered = [
        e["stateEnteredEventDetails"]["name"]
        for e in history(local_stack, job_id)
        if e["type"].endswith("StateEntered")
    ]
    print(f"\nstate transitions: {len(entered)} for a stage and a stage of 4 shards: {' > '.join(entered)}")
    # bench/cost.py's budget: 3 per shard, as a stage without shards, and 7 for the fan-out. Before
    # it, RunStages (the job took its project's lock at intake) and the first stage's 3.
    assert entered[:4] == ["RunStages", "MarkStageDispatched", "DispatchStage", "AwaitResult"]
    assert len(entered[4:-1]) == 4 * TRANSITIONS_PER_SHARD_BUDGET + TRANSITIONS_PER_FAN_OUT_BUDGET
    assert entered[4:8] == ["MarkStageDispatched", "GatedOrSharded", "StartShards", "RunShards"]
    # The shards' iterations run side by side: their states interleave as the threads go (each
    # shard's own come in order, which the names alone cannot show), so they are counted.
    assert sorted(entered[8:-4]) == sorted(
        ["ShardMarkStageDispatched", "ShardDispatchStage", "ShardAwaitResult"] * 4
    )
    assert entered[-4:] == [
        "AnyShardFailed",
        "RecordShardsSucceeded",
        "ShardsSucceeded",
        "ReleaseLockAndMarkSucceeded",
    ]


def test_fail_fast_stops_the_running_siblings_through_their_records_and_the_dead_letter_names_the_shard(
    local_stack, project_id
):
    job_id = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 3}])
    runs = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, job_id, 3)
    ]

    report(*runs[1], succeed=False)

    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    found = records(local_stack, job_id)
    assert [found[keys.shard_sk(0, shard)]["status"]["S"] for shard in range(3)] == [
        "canceled",
        "failed",
        "canceled",
    ]
    assert all("closed_at" in found[keys.shard_sk(0, shard)] for shard in range(3))
    # The siblings' agents learn it at their next fenced write, and stop their commands.
    with pytest.raises(stage_attempts.LeaseLost):
        stage_attempts.renew_lease(runs[0][0], 10, datetime.now(UTC))
    assert found["STAGE#00"]["status"]["S"] == "failed"
    entry = dead_letter(local_stack, job_id)
    detail = json.loads(entry["cause"])
    assert (entry["error"], detail["stage"], detail["shard"], detail["attempts"]) == (
        "Relevo.Fatal.ExitCode",
        "test",
        1,
        1,
    )


def test_without_fail_fast_the_siblings_finish_then_the_stage_fails_naming_each_failed_shard(
    local_stack, project_id
):
    job_id = start_job(
        local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 3, "fail_fast": False}]
    )
    runs = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, job_id, 3)
    ]

    report(*runs[0], succeed=False)
    report(*runs[2], succeed=False, error="Relevo.Fatal.Checksum")
    wait_until(
        lambda: records(local_stack, job_id)[keys.shard_sk(0, 2)]["status"]["S"] == "failed",
        10,
        "the third shard's failure",
    )
    report(*runs[1], succeed=True)

    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    found = records(local_stack, job_id)
    assert [found[keys.shard_sk(0, shard)]["status"]["S"] for shard in range(3)] == [
        "failed",
        "succeeded",
        "failed",
    ]
    # The failure is a summary (a bounded size whatever the shards' causes): the failed shards, the first
    # one's class.
    entry = dead_letter(local_stack, job_id)
    summary = json.loads(entry["cause"])
    assert (
        entry["error"],
        summary["stage"],
        summary["failed_shards"],
        summary["failed_count"],
        summary["shards"],
    ) == ("Relevo.Fatal.ExitCode", "test", [0, 2], 2, 3)
    assert summary["reason"] == "2 of 3 shards failed, the first (shard 0) with Relevo.Fatal.ExitCode"
    from relevo_cli.api import RelevoApi

    # The entry as an operator reads it (GET /dlq/{job}, relevo dlq view): every failed shard, each with what
    # it left on its record.
    described = RelevoApi.for_stack(local_stack).dead_letter(job_id)
    assert described["failed_shards"] == [0, 2]
    assert [
        (f["shard"], f["error_class"], f["attempts"], json.loads(f["cause"]))
        for f in described["shard_failures"]
    ] == [
        (0, "Relevo.Fatal.ExitCode", 1, {"exit_code": 2, "agent_id": "mac-0"}),
        (2, "Relevo.Fatal.Checksum", 1, {"exit_code": 2, "agent_id": "mac-2"}),
    ]


def test_without_fail_fast_one_failed_shard_fails_the_stage_with_its_own_error(local_stack, project_id):
    """One failure among the shards: moto's JSONPath reads `$[*].failed.Error` of a single match as
    the string itself where AWS gives a one-item list, so the error is each failed shard's own
    `error` (`$[*].error`, a list on both) taken by an intrinsic. The dead-letter entry names the
    shard and what it left."""
    job_id = start_job(
        local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 2, "fail_fast": False}]
    )
    runs = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, job_id, 2)
    ]

    report(*runs[1], succeed=False, error="Relevo.Fatal.Checksum")
    report(*runs[0], succeed=True)

    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    entry = dead_letter(local_stack, job_id)
    assert entry["error"] == "Relevo.Fatal.Checksum"
    assert json.loads(entry["cause"])["failed_shards"] == [1]
    from relevo_cli.api import RelevoApi

    described = RelevoApi.for_stack(local_stack).dead_letter(job_id)
    assert (described["failed_stage"], described["failed_shards"]) == ("test", [1])
    assert [(f["shard"], f["error_class"], f["attempts"]) for f in described["shard_failures"]] == [
        (1, "Relevo.Fatal.Checksum", 1)
    ]


def test_the_claim_route_claims_each_shard_on_its_own_record_and_refuses_a_message_without_its_shard(
    local_stack, project_id, tmp_path
):
    """The route the agents claim through: a shard's message (its shard and dispatch key) claims
    that shard's record only; the same dispatch key without the shard names the stage's own record,
    which was never dispatched, so nothing is claimed; the session renews on the shard's record."""
    from relevo_agent.claim import new_claim_secret
    from relevo_agent.claim_routes import RouteError
    from relevo_agent.config import AgentConfig
    from relevo_agent.service import Agent
    from relevo_core.models.agent_session import ClaimRequest, SessionRequest

    config = AgentConfig(
        agent_id="mac-s",
        region="eu-west",
        capacity=1,
        workspace_root=tmp_path / "ws",
        journal=tmp_path / "j.sqlite3",
        max_clock_skew_sec=0.5,
        prefer_previous_sec=0,
        handoff_max_wait_sec=0,
    )
    routes = Agent(
        config, local_stack.table_name, local_stack.work_queues["eu-west"], api_url=local_stack.api_url
    ).sessions.routes
    job_id = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 2}])
    tasks = stage_messages(local_stack, job_id, 2)

    def request(task: dict[str, Any], agent_id: str, **changed: Any) -> ClaimRequest:
        fields = {
            "job_id": job_id,
            "stage_index": 0,
            "shard": task["shard"],
            "attempt": 1,
            "agent_id": agent_id,
            "claim_secret": new_claim_secret(),
            "dispatch_key": task["dispatch_key"],
            "dispatch_token": task["task_token"],
            "project": project_id,
            "signs": False,
        }
        return ClaimRequest(**(fields | changed))

    with pytest.raises(RouteError) as refused:
        routes.claim(request(tasks[0], "mac-a", shard=None))
    assert (refused.value.status, refused.value.code) == (404, "DISPATCH_NOT_FOUND")
    with pytest.raises(RouteError) as refused:
        routes.claim(request(tasks[0], "mac-a", shard=1))  # shard 1's record, shard 0's dispatch key
    assert (refused.value.status, refused.value.code) == (404, "DISPATCH_NOT_FOUND")
    claims = [request(task, f"mac-{task['shard']}") for task in tasks]
    granted = [routes.claim(claim) for claim in claims]
    assert [grant.accepted for grant in granted] == [True, True]
    # Each shard's job credentials are a session of their own, named after the shard (CloudTrail).
    sessions = [
        client_as(
            local_stack,
            "sts",
            grant.session.access_key_id,
            grant.session.secret_access_key,
            grant.session.session_token,
        ).get_caller_identity()["Arn"]
        for grant in granted
    ]
    assert [arn.rsplit("/", 1)[1] for arn in sessions] == [
        f"{job_id}.0.shard-{shard}.1" for shard in range(2)
    ]

    found = records(local_stack, job_id)
    assert [
        (found[keys.shard_sk(0, shard)]["agent_id"]["S"], found[keys.shard_sk(0, shard)]["status"]["S"])
        for shard in range(2)
    ] == [("mac-0", "running"), ("mac-1", "running")]
    assert "agent_id" not in found["STAGE#00"]
    renewed = routes.renew(
        SessionRequest(
            job_id=job_id,
            stage_index=0,
            shard=1,
            attempt=1,
            agent_id="mac-1",
            claim_secret=claims[1].claim_secret,
        )
    )
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
    runs = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, job_id, 3)
    ]

    assert RelevoApi.for_stack(local_stack).cancel_job(job_id)["status"] == "canceled"

    found = records(local_stack, job_id)
    assert [
        (found[keys.shard_sk(0, shard)]["status"]["S"], "closed_at" in found[keys.shard_sk(0, shard)])
        for shard in range(3)
    ] == [("canceled", True)] * 3
    for ref, _ in runs:
        with pytest.raises(stage_attempts.LeaseLost):
            stage_attempts.renew_lease(ref, 10, datetime.now(UTC))
    assert wait_for_execution(local_stack, job_id, timeout=30)["status"] != "RUNNING"


def test_a_gated_stage_with_shards_waits_for_its_approval_then_fans_out(local_stack, project_id):
    from relevo_cli.api import RelevoApi

    job_id = start_job(
        local_stack,
        project_id,
        [BUILD, {"name": "deploy", "run": "make deploy", "parallel": 2}],
        approval={"enabled": True},
    )
    agent_runs(local_stack, stage_messages(local_stack, job_id, 1)[0])
    wait_until(
        lambda: records(local_stack, job_id)["JOB"]["status"]["S"] == "waiting", 10, "the approval wait"
    )
    assert records(local_stack, job_id)["JOB"]["waiting_stage"]["S"] == "deploy"

    RelevoApi.for_stack(local_stack).approve(job_id, "shipped")

    runs = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, job_id, 2)
    ]
    for ref, token in runs:
        report(ref, token, succeed=True)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    found = records(local_stack, job_id)
    assert found["STAGE#01"]["approved_at"]["S"] and found["STAGE#01"]["status"]["S"] == "succeeded"


def test_a_matrix_of_two_by_two_runs_on_four_agents_each_shard_once_with_its_own_variables(
    local_stack, project_id, tmp_path
):
    """Real agents (in process): each claims one shard through the claim route, runs its command
    with RELEVO_SHARD_INDEX / RELEVO_SHARD_COUNT / RELEVO_MATRIX_<KEY> and an operation id of its
    own, and reports on its shard's record; the stage succeeds once all four did."""
    seen = tmp_path / "seen"
    seen.mkdir()
    job_id = start_job(
        local_stack,
        project_id,
        [
            {
                "name": "test",
                "matrix": {"device": ["iPhone 16", "iPad Air"], "os": ["18.2", "17.5"]},
                "run": f'env | grep ^RELEVO_ | sort > "{seen}/$RELEVO_SHARD_INDEX.env"',
            }
        ],
    )
    tasks = stage_messages(local_stack, job_id, 4)

    for task in tasks:
        _run(agent_at(tmp_path, local_stack, f"mac-{task['shard']}"), task)

    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    combinations = [("iPhone 16", "18.2"), ("iPhone 16", "17.5"), ("iPad Air", "18.2"), ("iPad Air", "17.5")]
    operations = set()
    for shard, (device, os_version) in enumerate(combinations):
        env = dict(line.split("=", 1) for line in (seen / f"{shard}.env").read_text().splitlines())
        assert (
            env["RELEVO_SHARD_INDEX"],
            env["RELEVO_SHARD_COUNT"],
            env["RELEVO_MATRIX_DEVICE"],
            env["RELEVO_MATRIX_OS"],
        ) == (str(shard), "4", device, os_version)
        operations.add(env["RELEVO_OPERATION_ID"])
    assert operations == {f"{job_id}:test#shard-{shard}" for shard in range(4)}
    found = records(local_stack, job_id)
    assert [
        (found[keys.shard_sk(0, shard)]["status"]["S"], found[keys.shard_sk(0, shard)]["agent_id"]["S"])
        for shard in range(4)
    ] == [("succeeded", f"mac-{shard}") for shard in range(4)]


def test_a_shard_failing_transiently_is_retried_alone_on_its_own_record(local_stack, project_id):
    """Retries by error class per shard: shard 0's transient failure dispatches its attempt 2
    (its record, its message, naming the agent to avoid); shard 1 runs once."""
    job_id = start_job(
        local_stack,
        project_id,
        [{"name": "test", "run": "make test", "parallel": 2}],
        retry={"backoff_base_sec": 0},
    )
    runs = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, job_id, 2)
    ]

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


def test_the_job_view_status_list_and_log_show_each_shard_and_count_its_runs(
    local_stack, project_id, tmp_path, monkeypatch
):
    """A job of three stages, the second of four shards: six runs. With build and two shards done,
    the API's job view has a row per shard, `relevo job view` prints them under their stage, the
    listing says 3/6 (the CLI's too), and `relevo job logs --stage test --shard 2` prints that
    shard's lines only while the interleaved log labels each line with its shard."""
    from typer.testing import CliRunner

    from relevo_cli.api import RelevoApi
    from relevo_cli.commands.common import console
    from relevo_cli.main import app
    from relevo_core.store.log_writer import ChunkWriter

    monkeypatch.setattr(console, "width", 250)

    job_id = start_job(
        local_stack,
        project_id,
        [BUILD, {"name": "test", "run": "make test", "parallel": 4}, {"name": "ship", "run": "make ship"}],
    )
    agent_runs(local_stack, stage_messages(local_stack, job_id, 1)[0], agent_id="mac-b")
    runs = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, job_id, 4)
    ]
    now = datetime.now(UTC)
    for ref, _ in runs:
        ChunkWriter(ref, "test", expires_at=int(now.timestamp()) + 3600).append(
            f"shard {ref.shard} says hi\n", now
        )
    report(*runs[0], succeed=True)
    report(*runs[1], succeed=True)
    wait_until(
        lambda: records(local_stack, job_id)[keys.shard_sk(1, 1)]["status"]["S"] == "succeeded",
        10,
        "shard 1's end",
    )
    api = RelevoApi.for_stack(local_stack)

    listed = next(job for job in api.list_jobs(project=project_id)["jobs"] if job["job_id"] == job_id)
    assert (listed["runs_done"], listed["runs_total"], listed["stages_done"], listed["stages_total"]) == (
        3,
        6,
        1,
        3,
    )
    assert listed["agents"] == ["mac-b", "mac-0", "mac-1", "mac-2", "mac-3"]
    shards = api.get_job(job_id)["stages"][1]["shards"]
    assert [(s["label"], s["status"], s["agent_id"], s["attempt"]) for s in shards] == [
        ("0", "succeeded", "mac-0", 1),
        ("1", "succeeded", "mac-1", 1),
        ("2", "running", "mac-2", 1),
        ("3", "running", "mac-3", 1),
    ]

    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(local_stack.model_dump()))
    runner = CliRunner()
    shown = runner.invoke(app, ["job", "view", job_id, "--stack-file", str(stack_file)])
    assert shown.exit_code == 0, shown.output
    rows = [
        [cell.strip() for cell in line.split("│")[2:6]]
        for line in shown.output.splitlines()
        if line.startswith("│")
    ]
    assert rows == [
        ["build", "succeeded", "1", "mac-b"],
        ["test", "running", "", ""],
        ["├ 0", "succeeded", "1", "mac-0"],
        ["├ 1", "succeeded", "1", "mac-1"],
        ["├ 2", "running", "1", "mac-2"],
        ["└ 3", "running", "1", "mac-3"],
        ["ship", "pending", "", ""],
    ]
    assert "test[2]#1 | shard 2 says hi" in shown.output  # the log tail, each line labelled with its shard
    listing = runner.invoke(app, ["job", "list", "--project", project_id, "--stack-file", str(stack_file)])
    assert re.search(rf"{job_id}\s*│\s*{project_id}\s*│\s*running\s*│\s*3/6\s*│", listing.output), (
        listing.output
    )
    one = runner.invoke(
        app, ["job", "logs", job_id, "--stage", "test", "--shard", "2", "--stack-file", str(stack_file)]
    )
    assert (one.exit_code, one.output.splitlines()) == (
        0,
        ["── test[2] on mac-2 ──", "test[2]#1 | shard 2 says hi"],
    ), one.output
    every = runner.invoke(app, ["job", "logs", job_id, "--stack-file", str(stack_file)])
    assert [line for line in every.output.splitlines() if "says hi" in line] == [
        f"test[{shard}]#1 | shard {shard} says hi" for shard in range(4)
    ]
    refused = runner.invoke(
        app, ["job", "logs", job_id, "--stage", "test", "--shard", "4", "--stack-file", str(stack_file)]
    )
    assert (
        refused.exit_code == 2
        and "--shard '4': stage 'test' has no such shard; its shards: 0 to 3" in refused.output
    )

    for ref, token in runs[2:]:
        report(ref, token, succeed=True)
    agent_runs(local_stack, stage_messages(local_stack, job_id, 1)[0], agent_id="mac-b")
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    ended = next(job for job in api.list_jobs(project=project_id)["jobs"] if job["job_id"] == job_id)
    assert (ended["runs_done"], ended["runs_total"]) == (6, 6)
    followed = runner.invoke(
        app, ["job", "logs", job_id, "-f", "--stage", "test", "--shard", "2", "--stack-file", str(stack_file)]
    )
    # (its end line says how long the shard ran: ` after 1s`, left out here)
    assert followed.exit_code == 0 and re.sub(
        r" after (?:\d+h \d+m|\d+m \d+s|\d+s)", "", followed.stdout
    ).splitlines() == [
        "── test[2] on mac-2 ──",
        "test[2]#1 | shard 2 says hi",
        "── test[2] succeeded on mac-2 ──",
    ], followed.stdout
    watched = runner.invoke(app, ["job", "watch", job_id, "--stack-file", str(stack_file)])
    assert (
        watched.exit_code == 0 and "    test[3] succeeded on mac-3 (attempt 1)" in watched.stdout.splitlines()
    ), watched.stdout


def _run(agent, task: dict[str, Any]) -> None:
    from relevo_agent.messages import Message
    from tests.helpers.agents import handle_received

    handle_received(
        agent,
        Message(
            agent.queue_url,
            {"Body": json.dumps(task), "ReceiptHandle": "gone", "MessageId": agent.config.agent_id},
        ),
    )
    assert agent.sessions.held() == []


SHARDS_HAND_ON = [
    {
        "name": "build",
        "handoff": ["build/"],
        "run": (
            'mkdir -p build/App.app && printf "#!/bin/sh\\necho app\\n" > build/App.app/App && chmod 755 '
            "build/App.app/App && "
            'ln -s App build/App.app/Current && echo "version=1.4.$RELEVO_JOB_ID" >> "$RELEVO_OUTPUT"'
        ),
    },
    {
        "name": "test",
        "parallel": 3,
        "handoff": ["results/"],
        "run": (
            # The build's files and values reached every shard,
            'test -x build/App.app/App && test "$(readlink build/App.app/Current)" = App && test -n '
            '"$RELEVO_OUT_BUILD_VERSION" && '
            'test -z "$RELEVO_OUT_TEST_SHARD0_PASSED" && '
            # then each shard hands on its own results and a value.
            'mkdir -p "results/$RELEVO_SHARD_INDEX" && echo "shard $RELEVO_SHARD_INDEX of '
            '$RELEVO_OUT_BUILD_VERSION" > "results/$RELEVO_SHARD_INDEX/junit.xml" && '
            'chmod 640 "results/$RELEVO_SHARD_INDEX/junit.xml" && touch -t '
            '20200102030$RELEVO_SHARD_INDEX.05 "results/$RELEVO_SHARD_INDEX/junit.xml" && '
            'ln -s junit.xml "results/$RELEVO_SHARD_INDEX/latest" && echo "passed=$((10 + '
            'RELEVO_SHARD_INDEX))" >> "$RELEVO_OUTPUT"'
        ),
    },
]


def test_a_later_stage_gets_every_shards_values_and_files_exactly(local_stack, project_id, tmp_path):
    """Real agents (in process): build on one Mac; three shards of test on three others, each
    restored build's files and values, each handing on its own results/<k>/ and a value; report on
    a fifth Mac gets RELEVO_OUT_TEST_SHARD<k>_PASSED and every shard's files, byte for byte, with
    their modes, mtimes and links, and nothing its workspace held before."""
    seen = tmp_path / "seen"
    seen.mkdir()
    job_id = start_job(
        local_stack,
        project_id,
        [*SHARDS_HAND_ON, {"name": "report", "run": f'env | grep ^RELEVO_OUT_ | sort > "{seen}/report.env"'}],
    )
    report_workspace = tmp_path / "mac-r" / project_id
    (report_workspace / "results").mkdir(parents=True)
    (report_workspace / "results" / "stale.xml").write_text("an earlier job's")

    _run(agent_at(tmp_path, local_stack, "mac-b"), stage_messages(local_stack, job_id, 1)[0])
    for task in stage_messages(local_stack, job_id, 3):
        _run(agent_at(tmp_path, local_stack, f"mac-{task['shard']}"), task)
    _run(agent_at(tmp_path, local_stack, "mac-r"), stage_messages(local_stack, job_id, 1)[0])

    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    env = dict(line.split("=", 1) for line in (seen / "report.env").read_text().splitlines())
    assert env == {
        "RELEVO_OUT_BUILD_VERSION": f"1.4.{job_id}",
        **{f"RELEVO_OUT_TEST_SHARD{k}_PASSED": str(10 + k) for k in range(3)},
    }
    # Exactly what each shard left: type, bytes, mode, mtime, link target; the stale file gone.
    assert sorted(path.name for path in (report_workspace / "results").iterdir()) == ["0", "1", "2"]
    for k in range(3):
        assert tree_listing(report_workspace, f"results/{k}") == tree_listing(
            tmp_path / f"mac-{k}" / project_id, f"results/{k}"
        )
        assert [row[1] for row in tree_listing(report_workspace, f"results/{k}")] == [
            "dir",
            "file",
            "symlink",
        ]
        assert (
            report_workspace / "results" / str(k) / "junit.xml"
        ).read_text() == f"shard {k} of 1.4.{job_id}\n"
    found = {sk: from_attributes(item) for sk, item in records(local_stack, job_id).items()}
    report = found[keys.stage_sk(2)]
    assert report["restored"]["from_stages"] == ["build", "test#shard-0", "test#shard-1", "test#shard-2"]
    # Build's files were restored into every shard, exactly (the tree digest build stored).
    build_digest = found[keys.stage_sk(0)]["receipt"]["handoff"]["digest"]
    assert [
        (
            found[keys.shard_sk(1, k)]["restored"]["from_stages"],
            found[keys.shard_sk(1, k)]["restored"]["digest"],
        )
        for k in range(3)
    ] == [(["build"], build_digest)] * 3
    # Each shard's handoff is its own: its manifest, its summary on its own record.
    manifests = {found[keys.shard_sk(1, k)]["handoff_stored"]["manifest"].rsplit("/", 1)[1] for k in range(3)}
    assert manifests == {f"test.shard-{k}.1.json" for k in range(3)}


def test_two_shards_handing_on_one_path_differently_fail_the_later_stage_naming_both(
    local_stack, project_id, tmp_path
):
    job_id = start_job(
        local_stack,
        project_id,
        [
            {
                "name": "test",
                "parallel": 2,
                "handoff": ["results/"],
                "run": 'mkdir -p results && echo "shard $RELEVO_SHARD_INDEX" > results/junit.xml',
            },
            {"name": "report", "run": f'touch "{tmp_path}/report-ran"'},
        ],
    )
    for task in stage_messages(local_stack, job_id, 2):
        _run(agent_at(tmp_path, local_stack, f"mac-{task['shard']}"), task)
    _run(agent_at(tmp_path, local_stack, "mac-r"), stage_messages(local_stack, job_id, 1)[0])

    execution = wait_for_execution(local_stack, job_id)
    assert execution["status"] == "FAILED"
    report = from_attributes(records(local_stack, job_id)[keys.stage_sk(1)])
    assert (report["status"], report["error_class"]) == ("failed", "Relevo.Fatal.HandoffConflict")
    # The job's failure (what the dead-letter queue and `relevo job view` carry) names both shards and the
    # path.
    letter = dead_letter(local_stack, job_id)
    assert letter["error"] == "Relevo.Fatal.HandoffConflict", letter
    assert (
        f"shards test#shard-0 and test#shard-1 of {job_id} both hand on 'results/junit.xml' (differently)"
        in json.dumps(letter)
    )
    assert not (tmp_path / "report-ran").exists()
    assert not (tmp_path / "mac-r" / project_id / "results" / "junit.xml").exists()


def test_a_rerun_from_a_later_stage_restores_every_shards_handoff_from_the_job_it_reruns(
    local_stack, project_id, tmp_path
):
    """The rerun's report, on a Mac that ran nothing, gets the first job's shards' values and
    files; once a shard's manifest has expired, a rerun is refused up front naming that shard."""
    from relevo_cli.api import ApiError, RelevoApi

    seen = tmp_path / "seen.env"
    job_id = start_job(
        local_stack,
        project_id,
        [
            {
                "name": "test",
                "parallel": 2,
                "handoff": ["results/"],
                "run": (
                    'mkdir -p "results/$RELEVO_SHARD_INDEX" && echo "$RELEVO_JOB_ID" > '
                    '"results/$RELEVO_SHARD_INDEX/junit.xml" && '
                    'echo "passed=$((10 + RELEVO_SHARD_INDEX))" >> "$RELEVO_OUTPUT"'
                ),
            },
            {
                "name": "report",
                "run": f'cat results/0/junit.xml results/1/junit.xml > "{seen}" && env | grep ^RELEVO_OUT_ '
                f'| sort >> "{seen}"',
            },
        ],
    )
    for task in stage_messages(local_stack, job_id, 2):
        _run(agent_at(tmp_path, local_stack, f"mac-{task['shard']}"), task)
    _run(agent_at(tmp_path, local_stack, "mac-r"), stage_messages(local_stack, job_id, 1)[0])
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    seen.unlink()

    api = RelevoApi.for_stack(local_stack)
    rerun = api.rerun_job(job_id, "report")["job_id"]
    _run(agent_at(tmp_path, local_stack, "mac-new"), stage_messages(local_stack, rerun, 1)[0])

    assert wait_for_execution(local_stack, rerun)["status"] == "SUCCEEDED"
    assert seen.read_text().splitlines() == [
        job_id,
        job_id,
        "RELEVO_OUT_TEST_SHARD0_PASSED=10",
        "RELEVO_OUT_TEST_SHARD1_PASSED=11",
    ]
    restored = from_attributes(records(local_stack, rerun)[keys.stage_sk(1)])["restored"]
    assert restored["from_stages"] == ["test#shard-0", "test#shard-1"] and restored["restored_bytes"] > 0

    manifest = from_attributes(records(local_stack, job_id)[keys.shard_sk(0, 1)])["handoff_stored"][
        "manifest"
    ]
    bucket, key = manifest.removeprefix("s3://").split("/", 1)
    client("s3").delete_object(Bucket=bucket, Key=key)
    with pytest.raises(ApiError) as expired:
        api.rerun_job(job_id, "report")
    assert (
        expired.value.code == "HANDOFF_EXPIRED"
        and f"stage test#shard-1 of {job_id} handed on files" in str(expired.value)
    )


def test_a_shard_ending_warning_makes_its_stage_warning_in_the_job_view_and_the_notifications(
    local_stack, project_id
):
    """A shard's agent says `warning`: the stage's record ends `warning`, and the job's
    stage_outcomes carry every shard's answer in shard order with the stage's status `warning`,
    which the commit status and notifications read (notify.transitions.warning_stages)."""
    from relevo_cli.api import RelevoApi
    from relevo_core.notify.transitions import warning_stages

    job_id = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 3}])
    runs = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, job_id, 3)
    ]

    for shard, (ref, token) in enumerate(runs):
        report(ref, token, succeed=True, status=StageStatus.WARNING if shard == 1 else StageStatus.SUCCEEDED)

    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    found = records(local_stack, job_id)
    assert (found["STAGE#00"]["status"]["S"], found[keys.shard_sk(0, 1)]["status"]["S"]) == (
        "warning",
        "warning",
    )
    [outcome] = json.loads(found["JOB"]["stage_outcomes"]["S"])
    assert (outcome["stage"], outcome["status"], outcome["shards"]) == ("test", "warning", 3)
    assert [answer["status"] for answer in outcome["shard_outcomes"]] == ["succeeded", "warning", "succeeded"]
    assert [answer["agent_id"] for answer in outcome["shard_outcomes"]] == ["mac-0", "mac-1", "mac-2"]
    assert warning_stages(found["JOB"]["stage_outcomes"]["S"]) == ("test",)
    entered = [
        e["stateEnteredEventDetails"]["name"]
        for e in history(local_stack, job_id)
        if e["type"].endswith("StateEntered")
    ]
    # bench/cost.py: a warned stage's fan-out costs ShardsWarned more (after RunStages: the job
    # took its project's lock at intake).
    assert entered[0] == "RunStages"
    assert (
        entered[1:-1].count("ShardsWarned") == 1
        and len(entered[1:-1]) == 3 * TRANSITIONS_PER_SHARD_BUDGET + TRANSITIONS_PER_FAN_OUT_BUDGET + 1
    )
    job = RelevoApi.for_stack(local_stack).get_job(job_id)
    assert (job["status"], job["warning_stages"]) == ("succeeded", ["test"])


def test_a_shard_in_manual_review_is_resolved_on_its_record_and_the_job_stands_once_all_succeeded(
    local_stack, project_id
):
    """A shard's reconciliation finds an effect it cannot tie to its operation: that shard waits
    for an operator (`relevo job resolve --stage test --shard 0`) while its sibling runs on.
    Resolving it as succeeded ends the shard's record only: the job's last successful stage stays
    the one before until the stage as a whole succeeded."""
    from relevo_cli.api import ApiError, RelevoApi

    api = RelevoApi.for_stack(local_stack)
    job_id = start_job(local_stack, project_id, [BUILD, {"name": "test", "run": "make test", "parallel": 2}])
    agent_runs(local_stack, stage_messages(local_stack, job_id, 1)[0])
    (ref, token), sibling = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, job_id, 2)
    ]
    now = datetime.now(UTC)
    stage_attempts.record_reconciled(
        ref, "manual_review", {"probe_exit": 0, "probe_output": "shard 0 results"}, now
    )
    stage_attempts.finish(
        ref,
        StageStatus.MANUAL_REVIEW,
        now,
        None,
        "Relevo.Reconcile.ManualReview",
        outcome=stage_attempts.AttemptOutcome.MANUAL_REVIEW,
    )
    client("stepfunctions").send_task_failure(
        taskToken=token, error="Relevo.Reconcile.ManualReview", cause="{}"
    )
    wait_until(
        lambda: "review_attempt" in records(local_stack, job_id)[keys.shard_sk(1, 0)],
        20,
        "shard 0 waiting for review",
    )

    with pytest.raises(ApiError) as refused:
        api.resolve_stage(
            job_id, "test", "succeeded"
        )  # the stage's own record is never in review: name the shard
    assert (refused.value.status, refused.value.code) == (422, "VALIDATION_FAILED")
    assert api.resolve_stage(job_id, "test", "succeeded", "checked by hand", shard=0)["shard"] == 0

    wait_until(
        lambda: records(local_stack, job_id)[keys.shard_sk(1, 0)]["status"]["S"] == "succeeded",
        10,
        "shard 0 resolved",
    )
    found = records(local_stack, job_id)
    assert (found["JOB"].get("last_successful_stage", {}).get("S"), found["STAGE#01"]["status"]["S"]) == (
        None,
        "running",
    )
    report(*sibling, succeed=True)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    found = records(local_stack, job_id)
    assert (found["JOB"]["last_successful_stage"]["S"], found["STAGE#01"]["status"]["S"]) == (
        "test",
        "succeeded",
    )
    assert found[keys.shard_sk(1, 0)]["resolution"]["M"]["as"]["S"] == "succeeded"


def test_a_rerun_from_a_stage_with_shards_runs_every_shard_again_on_the_earlier_stages_of_the_job_it_retries(
    local_stack, project_id
):
    """`relevo job rerun --from-stage test`: a new job whose earlier stage is reused from the job
    it retries, and whose stage with shards runs every shard again, each attempt 1 on its own
    record, the one that succeeded before included."""
    from relevo_cli.api import RelevoApi

    api = RelevoApi.for_stack(local_stack)
    original = start_job(
        local_stack, project_id, [BUILD, {"name": "test", "run": "make test", "parallel": 2}]
    )
    agent_runs(local_stack, stage_messages(local_stack, original, 1)[0])
    first, second = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, original, 2)
    ]
    report(*first, succeed=True)
    wait_until(
        lambda: records(local_stack, original)[keys.shard_sk(1, 0)]["status"]["S"] == "succeeded",
        10,
        "shard 0's success",
    )
    report(*second, succeed=False)
    assert wait_for_execution(local_stack, original)["status"] == "FAILED"

    rerun = api.rerun_job(original, "test")["job_id"]

    tasks = stage_messages(local_stack, rerun, 2)
    assert [(task["stage"], task["shard"], task["attempt"]) for task in tasks] == [
        ("test", 0, 1),
        ("test", 1, 1),
    ]
    for ref, token in [claim_shard(local_stack, task, f"mac-{task['shard'] + 2}") for task in tasks]:
        report(ref, token, succeed=True)
    assert wait_for_execution(local_stack, rerun)["status"] == "SUCCEEDED"
    found = records(local_stack, rerun)
    assert [
        (
            found[keys.shard_sk(1, shard)]["attempt"]["N"],
            found[keys.shard_sk(1, shard)]["agent_id"]["S"],
            "carried_from" in found[keys.shard_sk(1, shard)],
        )
        for shard in range(2)
    ] == [("1", "mac-2", False), ("1", "mac-3", False)]
    view = api.get_job(rerun)
    assert [(stage["name"], stage["status"], stage["reused_from"]) for stage in view["stages"]] == [
        ("build", "skipped", original),
        ("test", "succeeded", None),
    ]
    assert (view["from_stage"], view["retry_of"], view["last_successful_stage"]) == ("test", original, "test")


def test_a_redrive_runs_only_the_shards_that_failed_and_carries_the_others_as_succeeded(
    local_stack, project_id
):
    """Three shards without fail_fast: shard 1 fails for good, 0 and 2 succeed, the job is
    dead-lettered naming shard 1. Its redrive carries shards 0 and 2 over as succeeded (closed
    records naming the job they ran in), so the new execution dispatches shard 1 alone: one agent
    run of the stage, then the stage after it, and the job succeeds. No succeeded shard's effect
    happens twice."""
    from relevo_cli.api import RelevoApi

    api = RelevoApi.for_stack(local_stack)
    stages = [
        {"name": "test", "run": "make test", "parallel": 3, "fail_fast": False},
        {"name": "notify", "run": "true"},
    ]
    failed = start_job(local_stack, project_id, stages)
    runs = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, failed, 3)
    ]
    report(*runs[0], succeed=True)
    report(*runs[2], succeed=True)
    wait_until(
        lambda: [records(local_stack, failed)[keys.shard_sk(0, shard)]["status"]["S"] for shard in (0, 2)]
        == ["succeeded"] * 2,
        10,
        "shards 0 and 2 succeeded",
    )
    report(*runs[1], succeed=False)
    assert wait_for_execution(local_stack, failed)["status"] == "FAILED"
    entry = api.dead_letter(failed)
    assert (entry["failed_stage"], entry["failed_shards"], entry["attempts"]) == ("test", [1], 1)

    redriven = api.redrive(failed)["job_id"]

    [task] = stage_messages(local_stack, redriven, 1)
    assert (task["stage"], task["shard"], task["attempt"]) == ("test", 1, 1)
    report(*claim_shard(local_stack, task, "mac-9"), succeed=True)
    [notify] = stage_messages(local_stack, redriven, 1)
    assert notify["stage"] == "notify"  # and no other shard's message came before it
    agent_runs(local_stack, notify)
    assert wait_for_execution(local_stack, redriven)["status"] == "SUCCEEDED"

    entered = [
        e["stateEnteredEventDetails"]["name"]
        for e in history(local_stack, redriven)
        if e["type"].endswith("StateEntered")
    ]
    assert (
        entered.count("ShardMarkStageDispatched"),
        entered.count("ShardDispatchStage"),
        entered.count("ShardClosedBeforeDispatch"),
    ) == (3, 1, 2)
    found = records(local_stack, redriven)
    shards = [found[keys.shard_sk(0, shard)] for shard in range(3)]
    assert [(s["status"]["S"], s["agent_id"]["S"], s.get("carried_from", {}).get("S")) for s in shards] == [
        ("succeeded", "mac-0", failed),
        ("succeeded", "mac-9", None),
        ("succeeded", "mac-2", failed),
    ]
    assert not any("dispatch_key" in s or "run_handed_at" in s for s in (shards[0], shards[2]))
    assert (found["STAGE#00"]["status"]["S"], found["JOB"]["last_successful_stage"]["S"]) == (
        "succeeded",
        "notify",
    )
    outcome = json.loads(found["JOB"]["stage_outcomes"]["S"])[0]
    assert [answer.get("dispatched", True) for answer in outcome["shard_outcomes"]] == [False, True, False]
    # The carried shards keep the records of where they ran; the failed job's are unchanged.
    assert records(local_stack, failed)[keys.shard_sk(0, 0)]["status"]["S"] == "succeeded"


def test_a_paused_region_holds_a_stage_with_shards_each_renewed_while_it_waits_then_releases_it(
    local_stack, project_id
):
    """Issue 20 with shards: the region's dispatch is paused, nobody claims the two shards, and
    their queue_timeout_sec (5 s) runs out. Neither fails: each is sent again (same attempt), its
    wait renewed for an hour per shard that may wait (2 h), so the shards together renew no more
    often than one stage (relevo_core.plan_limits: pause holds). After the resume both run from
    their second messages and the job succeeds. Prints the history events one renewal costs."""
    from relevo_core.plan_limits import EVENTS_PER_PAUSE_RENEWAL
    from tests.helpers import TEST_ADMIN_ARN
    from tests.helpers.iam import iam_user

    def dispatch_waits() -> list[int]:
        return [
            e["taskScheduledEventDetails"].get("timeoutInSeconds")
            for e in history(local_stack, job_id)
            if e["type"] == "TaskScheduled"
            and e["taskScheduledEventDetails"]["resource"] == "sendMessage.waitForTaskToken"
        ]

    admin = iam_user(local_stack, TEST_ADMIN_ARN.rsplit("/", 1)[1])
    status, answer = admin.call("POST", "/regions/eu-west/pause", {"note": "held shards", "timeout_sec": 300})
    assert status == 200, answer
    try:
        job_id = start_job(
            local_stack,
            project_id,
            [{"name": "test", "run": "make test", "parallel": 2}],
            queue_timeout_sec=5,
        )
        stage_messages(
            local_stack, job_id, 2
        )  # the first messages, which nobody claims while the region is paused
        before = len(list(history(local_stack, job_id)))
        wait_until(lambda: len(dispatch_waits()) == 4, 30, "both shards' queue waits renewed")
        holds = [records(local_stack, job_id)[keys.shard_sk(0, shard)] for shard in range(2)]
        after = len(list(history(local_stack, job_id)))
        assert [(hold["status"]["S"], hold["pause_holds"]["N"]) for hold in holds] == [
            ("dispatched", "1")
        ] * 2
        assert (
            client("stepfunctions").describe_execution(executionArn=job_execution_arn(local_stack, job_id))[
                "status"
            ]
            == "RUNNING"
        )
    finally:
        assert admin.call("POST", "/regions/eu-west/resume", None)[1]["resumed"] is True

    assert dispatch_waits() == [5, 5, 2 * 3600, 2 * 3600]
    per_renewal = (after - before) / 2
    print(
        f"\nhistory events per pause renewal of a shard: {per_renewal} (plan_limits counts "
        f"{EVENTS_PER_PAUSE_RENEWAL})"
    )
    assert per_renewal <= EVENTS_PER_PAUSE_RENEWAL
    tasks = stage_messages(local_stack, job_id, 2)
    assert [(task["shard"], task["attempt"]) for task in tasks] == [(0, 1), (1, 1)]
    for ref, token in [claim_shard(local_stack, task, f"mac-{task['shard']}") for task in tasks]:
        report(ref, token, succeed=True)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    assert [records(local_stack, job_id)[keys.shard_sk(0, shard)]["attempt"]["N"] for shard in range(2)] == [
        "1",
        "1",
    ]


def test_a_redrive_after_fail_fast_runs_the_failed_shard_and_stopped_siblings_not_the_succeeded_one(
    local_stack, project_id
):
    """With fail_fast, shard 1's failure stops shard 2 (canceled) after shard 0 succeeded: the
    redrive dispatches shards 1 and 2, each attempt 1, and carries shard 0."""
    from relevo_cli.api import RelevoApi

    api = RelevoApi.for_stack(local_stack)
    failed = start_job(local_stack, project_id, [{"name": "test", "run": "make test", "parallel": 3}])
    runs = [
        claim_shard(local_stack, task, f"mac-{task['shard']}")
        for task in stage_messages(local_stack, failed, 3)
    ]
    report(*runs[0], succeed=True)
    wait_until(
        lambda: records(local_stack, failed)[keys.shard_sk(0, 0)]["status"]["S"] == "succeeded",
        10,
        "shard 0's success",
    )
    report(*runs[1], succeed=False)
    assert wait_for_execution(local_stack, failed)["status"] == "FAILED"
    assert [records(local_stack, failed)[keys.shard_sk(0, shard)]["status"]["S"] for shard in range(3)] == [
        "succeeded",
        "failed",
        "canceled",
    ]
    assert api.dead_letter(failed)["failed_shards"] == [1]

    redriven = api.redrive(failed)["job_id"]

    tasks = stage_messages(local_stack, redriven, 2)
    assert [(task["shard"], task["attempt"]) for task in tasks] == [(1, 1), (2, 1)]
    for ref, token in [claim_shard(local_stack, task, f"mac-{task['shard'] + 3}") for task in tasks]:
        report(ref, token, succeed=True)
    assert wait_for_execution(local_stack, redriven)["status"] == "SUCCEEDED"
    found = records(local_stack, redriven)
    assert [
        (
            found[keys.shard_sk(0, shard)]["agent_id"]["S"],
            found[keys.shard_sk(0, shard)].get("carried_from", {}).get("S"),
        )
        for shard in range(3)
    ] == [("mac-0", failed), ("mac-4", None), ("mac-5", None)]


def test_the_job_view_says_why_each_unclaimed_shard_waits(local_stack, project_id):
    """The one agent meeting the stage's `requires` (a label of its own) is full: the shard not
    claimed yet waits with agent_busy, named in `waiting_shards`, in the job's own reason and in
    the queue's rows; once the agent has a free slot, the shard is about to be claimed (no reason)."""
    from relevo_core.jobs.queue import queue_view
    from relevo_core.jobs.view import show_job
    from relevo_core.models.capabilities import Capabilities
    from relevo_core.store import agents

    pool = f"pool-{project_id}"
    job_id = start_job(
        local_stack,
        project_id,
        [{"name": "test", "run": "make test", "parallel": 2, "requires": {"pool": pool}}],
    )
    first, _ = stage_messages(local_stack, job_id, 2)
    claim_shard(local_stack, first, "mac-0")

    def presence(running: int) -> None:
        agents.put_presence(
            local_stack.table_name,
            agents.AgentPresence(
                agent_id=f"mac-{pool}",
                region="eu-west",
                capacity=1,
                running=running,
                version="0.1.0",
                last_seen=datetime.now(UTC),
                interval_sec=30,
                capabilities=Capabilities(os="darwin", arch="arm64", labels={"pool": pool}),
            ),
        )

    presence(running=1)
    view = show_job(local_stack.table_name, job_id, datetime.now(UTC))
    assert view["waiting_shards"] == [
        {"stage": "test", "shard": 1, "attempt": 1, "queue_reason": "agent_busy", "queue_detail": None}
    ]
    assert (view["queue_reason"], view["stages"][0]["status"]) == ("agent_busy", "running")
    # The queue (GET /queue, relevo queue) lists the shard as waiting for an agent, and why.
    queue = queue_view(local_stack.table_name, ("eu-west",), lambda project: True, datetime.now(UTC))
    assert [
        (row["stage"], row["shard"], row["queue_reason"])
        for row in queue["waiting_for_agent"]
        if row["job_id"] == job_id
    ] == [("test", 1, "agent_busy")]

    presence(running=0)
    view = show_job(local_stack.table_name, job_id, datetime.now(UTC))
    assert [(shard["shard"], shard["queue_reason"]) for shard in view["waiting_shards"]] == [(1, None)]
    assert view["queue_reason"] is None


def test_each_shards_artifacts_are_its_own_listed_and_downloaded_by_shard(
    local_stack, project_id, tmp_path, monkeypatch
):
    """Real agents (in process): two shards leave app.ipa of bytes of their own. Each is stored
    under test/shard-<k>/ with a record naming its shard (neither overwrites the other), the job
    view and `relevo artifact list` name the shard, the name alone is ambiguous (409 naming the
    shards), and `relevo artifact download --shard 1` gets shard 1's bytes, verified."""
    from typer.testing import CliRunner

    from relevo_cli.api import ApiError, RelevoApi
    from relevo_cli.commands.common import console
    from relevo_cli.main import app

    monkeypatch.setattr(console, "width", 250)
    job_id = start_job(
        local_stack,
        project_id,
        [
            {
                "name": "test",
                "parallel": 2,
                "run": 'echo "built by shard $RELEVO_SHARD_INDEX" > "$RELEVO_ARTIFACT_DIR/app.ipa"',
            }
        ],
    )
    for task in stage_messages(local_stack, job_id, 2):
        _run(agent_at(tmp_path, local_stack, f"mac-{task['shard']}"), task)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"

    api = RelevoApi.for_stack(local_stack)
    view = api.get_job(job_id)
    assert sorted((a["stage"], a["shard"], a["name"], a["size"]) for a in view["artifacts"]) == [
        ("test", 0, "app.ipa", len("built by shard 0\n")),
        ("test", 1, "app.ipa", len("built by shard 1\n")),
    ]
    for shard in range(2):
        link = api.artifact_link(job_id, "app.ipa", shard=shard)
        assert link["shard"] == shard and urlsplit(link["url"]).path.endswith(
            f"/{job_id}/test/shard-{shard}/app.ipa"
        ), link["url"]
    with pytest.raises(ApiError) as ambiguous:
        api.artifact_link(job_id, "app.ipa")
    assert (ambiguous.value.status, ambiguous.value.code) == (409, "ARTIFACT_AMBIGUOUS")
    assert ambiguous.value.body["details"] == {"stages": ["test"], "shards": [0, 1]}
    with pytest.raises(ApiError) as missing:
        api.artifact_link(job_id, "app.ipa", shard=2)
    assert (missing.value.status, missing.value.code) == (404, "ARTIFACT_NOT_FOUND")

    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(local_stack.model_dump()))
    runner = CliRunner()
    listed = runner.invoke(app, ["artifact", "list", job_id, "--stack-file", str(stack_file)])
    assert listed.exit_code == 0 and "test#shard-0" in listed.stdout and "test#shard-1" in listed.stdout, (
        listed.stdout
    )
    out = tmp_path / "dl" / "app.ipa"
    got = runner.invoke(
        app,
        [
            "artifact",
            "download",
            job_id,
            "app.ipa",
            "--shard",
            "1",
            "-o",
            str(out),
            "--stack-file",
            str(stack_file),
        ],
    )
    assert got.exit_code == 0, got.output
    assert out.read_text() == "built by shard 1\n"


def _sharded_first_checkout(
    local_stack, project_id: str, tmp_path
) -> tuple[str, Any, str, list[dict[str, Any]]]:
    """A job from the ref main of a project whose first stage to check out has two shards; a
    report after it writes the commit it built. Returns (job, clone to push from, main's commit,
    the shards' stage messages)."""
    from relevo_cli.api import RelevoApi
    from tests.integration.test_stage_handoff import _git, _repository

    origin, work = _repository(tmp_path)
    RelevoApi.for_stack(local_stack).put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "checkout": {"url": str(origin), "timeout_sec": 60},
            "stages": [
                {"name": "test", "parallel": 2, "run": "true"},
                {
                    "name": "report",
                    "run": f'echo "$RELEVO_COMMIT $(cat VERSION)" > "{tmp_path}/report-built"',
                },
            ],
        },
    )
    job_id = RelevoApi.for_stack(local_stack).run_project(project_id, {"ref": "main"})["job_id"]
    return job_id, work, _git("rev-parse", "HEAD", cwd=work), stage_messages(local_stack, job_id, 2)


@pytest.mark.timeout(240)
def test_a_later_stage_builds_the_commit_the_shards_of_the_first_checkout_resolved(
    local_stack, project_id, tmp_path
):
    """Each shard records the commit it resolved on its own record; the later stage finds it
    there, not the branch's tip after it moved."""
    from tests.integration.test_stage_handoff import _push

    job_id, work, first, tasks = _sharded_first_checkout(local_stack, project_id, tmp_path)
    for task in tasks:
        _run(agent_at(tmp_path, local_stack, f"mac-{task['shard']}"), task)
    assert _push(work, "1.5.0") != first
    _run(agent_at(tmp_path, local_stack, "mac-r"), stage_messages(local_stack, job_id, 1)[0])

    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    assert (tmp_path / "report-built").read_text() == f"{first} 1.4.0\n"
    found = {sk: from_attributes(item) for sk, item in records(local_stack, job_id).items()}
    assert [found[keys.shard_sk(0, k)]["checkout_commit"] for k in range(2)] == [first, first]
    from relevo_cli.api import RelevoApi

    job = RelevoApi.for_stack(local_stack).get_job(job_id)
    assert (job["commit"], job["commit_source"]) == (first, "checkout")


@pytest.mark.timeout(240)
def test_shards_that_checked_out_different_commits_fail_the_later_stage_naming_each_and_a_rerun_is_refused(
    local_stack, project_id, tmp_path
):
    """The branch moves between the two shards' checkouts: the job has no one commit. The later
    stage fails for good before running (Relevo.Fatal.Checkout, naming each shard's commit), and
    a rerun, which would pin the job's commit, is refused with COMMITS_DIFFER."""
    from relevo_cli.api import ApiError, RelevoApi
    from tests.integration.test_stage_handoff import _push

    job_id, work, first, tasks = _sharded_first_checkout(local_stack, project_id, tmp_path)
    _run(agent_at(tmp_path, local_stack, "mac-0"), tasks[0])
    moved = _push(work, "1.5.0")
    _run(agent_at(tmp_path, local_stack, "mac-1"), tasks[1])
    _run(agent_at(tmp_path, local_stack, "mac-r"), stage_messages(local_stack, job_id, 1)[0])

    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    assert not (tmp_path / "report-built").exists()
    report = from_attributes(records(local_stack, job_id)[keys.stage_sk(1)])
    assert (report["status"], report["error_class"]) == ("failed", "Relevo.Fatal.Checkout")
    letter = dead_letter(local_stack, job_id)
    assert letter["error"] == "Relevo.Fatal.Checkout", letter
    assert (
        f"the shards of stage test checked out main at different commits (shard 0 {first}, shard 1 {moved})"
        in json.dumps(letter)
    )
    api = RelevoApi.for_stack(local_stack)
    assert api.get_job(job_id)["commit"] is None
    with pytest.raises(ApiError) as refused:
        api.rerun_job(job_id, None)
    assert (refused.value.status, refused.value.code) == (409, "COMMITS_DIFFER")
    assert refused.value.body["details"]["commits"] == {"0": first, "1": moved}


def _fail_every_shard(stack, job_id: str, count: int, cause: str, timeout: float = 240) -> None:
    """Play the agents of `count` shards, each failing for good with `cause`: claim, accept, record
    and report each message of the job as it comes (max_parallel holds some back until others end)."""
    sqs, failed = client("sqs"), set()
    deadline = time.monotonic() + timeout
    while len(failed) < count and time.monotonic() < deadline:
        for message in sqs.receive_message(
            QueueUrl=stack.work_queues["eu-west"], WaitTimeSeconds=1, MaxNumberOfMessages=10
        ).get("Messages", []):
            sqs.delete_message(QueueUrl=stack.work_queues["eu-west"], ReceiptHandle=message["ReceiptHandle"])
            task = json.loads(message["Body"])
            if task["job_id"] != job_id or task["shard"] in failed:
                continue
            ref, token = claim_shard(stack, task, f"mac-{task['shard']}")
            stage_attempts.finish(ref, StageStatus.FAILED, datetime.now(UTC), 2, "Relevo.Fatal.ExitCode")
            client("stepfunctions").send_task_failure(
                taskToken=token, error="Relevo.Fatal.ExitCode", cause=cause
            )
            failed.add(task["shard"])
    assert len(failed) == count, f"{len(failed)} of {count} shards failed"


def test_every_shard_of_the_largest_fan_out_failing_with_the_longest_cause_stays_inside_the_quotas(
    local_stack,
    project_id,
):
    """fail_fast false at the largest fan-out one stage may have (relevo_core.plan_limits.MAX_SHARD_RUNS
    shards), every shard failing for good with the longest cause an agent reports
    (MAX_FAILURE_CAUSE_CHARS), made of quotes and backslashes, which JSON escapes at every level.
    Step Functions refuses a state input or output over 262,144 bytes of UTF-8 (States.DataLimitExceeded,
    which no Catch takes: "Handling errors in Step Functions workflows") and keeps a cause of at most
    32,768 characters (API Reference, ExecutionFailedEventDetails / TaskFailedEventDetails). The stage
    fails with a summary (its failed shards, the first's class, where the rest is); each shard's own
    record holds its failure, and the dead-letter entry's view and the job view name every shard
    with its class and cause."""
    from relevo_cli.api import RelevoApi
    from relevo_core.plan_limits import MAX_FAILURE_CAUSE_CHARS, MAX_SHARD_RUNS, STATE_PAYLOAD_QUOTA_BYTES

    # Given: one stage of as many shards as a job may run, at most 40 at once, fail_fast false
    shards = MAX_SHARD_RUNS
    cause = ('{"why": "\\"quoted\\" \\\\ path"}' * MAX_FAILURE_CAUSE_CHARS)[:MAX_FAILURE_CAUSE_CHARS]
    job_id = start_job(
        local_stack,
        project_id,
        [{"name": "test", "run": "make test", "parallel": shards, "max_parallel": 40, "fail_fast": False}],
    )

    # When: every shard fails for good with the longest cause
    _fail_every_shard(local_stack, job_id, shards, cause)

    # Then: the job failed with the shards' own class, recorded and dead-lettered
    ended = wait_for_execution(local_stack, job_id, timeout=60)
    assert (ended["status"], ended["error"]) == ("FAILED", "Relevo.Fatal.ExitCode"), ended.get("cause", "")[
        :300
    ]
    events = history(local_stack, job_id)
    largest_state, longest_cause = 0, 0
    for event in events:
        for details in (value for value in event.values() if isinstance(value, dict)):
            for field in ("input", "output", "parameters"):
                if isinstance(details.get(field), str):
                    largest_state = max(largest_state, len(details[field].encode("utf-8")))
            if isinstance(details.get("cause"), str):
                longest_cause = max(longest_cause, len(details["cause"]))
    print(
        f"\n{shards} failed shards: the largest state {largest_state:,} bytes, the longest cause "
        f"{longest_cause:,} characters"
    )
    assert largest_state < STATE_PAYLOAD_QUOTA_BYTES
    assert longest_cause <= 32_768
    summary = json.loads(ended["cause"])
    assert (summary["stage"], summary["failed_shards"], summary["error_class"]) == (
        "test",
        list(range(shards)),
        "Relevo.Fatal.ExitCode",
    )
    found = records(local_stack, job_id)
    assert (
        found["JOB"]["status"]["S"] == "failed"
        and json.loads(found["JOB"]["error_cause"]["S"])["failed_count"] == shards
    )
    # The dead-letter entry as an operator reads it: every failed shard, its class and cause, from its record.
    described = RelevoApi.for_stack(local_stack).dead_letter(job_id)
    assert (described["failed_stage"], described["failed_shards"]) == ("test", list(range(shards)))
    assert [
        (f["shard"], f["error_class"], f["attempts"], f["cause"]) for f in described["shard_failures"]
    ] == [(shard, "Relevo.Fatal.ExitCode", 1, cause) for shard in range(shards)]
    listed = next(
        entry
        for entry in RelevoApi.for_stack(local_stack).dead_letters()["entries"]
        if entry["job_id"] == job_id
    )
    assert listed["failed_shards"] == list(range(shards))
    view = RelevoApi.for_stack(local_stack).get_job(job_id)
    assert [
        (s["shard"], s["status"], s["attempts_log"][-1]["error"], s["attempts_log"][-1]["cause"])
        for s in view["stages"][0]["shards"]
    ] == [(shard, "failed", "Relevo.Fatal.ExitCode", cause) for shard in range(shards)]
