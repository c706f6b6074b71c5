"""Issue 14: the write half of fencing. An agent's writes need its attempt to be live (not given
up by the state machine, not ended with its job); a stage of an ended job gets a terminal status
and no claim takes it; a claim can be sent again after a lost answer; a report too."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.models.status import StageStatus
from relevo_core.models.transfer import TransferProgress
from relevo_core.store import stage_attempts, stage_claims
from relevo_core.store.codec import from_attributes
from tests.helpers.agents import handle_received
from tests.helpers.stack import job_execution_arn, job_items, receive_stage
from tests.helpers.state_machine import TWO_STAGES, claim_and_accept, start_job, wait_for_run_token


def _stage(stack, job_id, sk: str = "STAGE#00") -> dict:
    return {item["sk"]["S"]: from_attributes(item) for item in job_items(stack, job_id)}[sk]


def _now() -> datetime:
    return datetime.now(UTC)


def test_a_canceled_jobs_stage_is_canceled_its_holder_refused_and_no_claim_takes_it(local_stack, project_id):
    job_id = start_job(local_stack, project_id, stages=TWO_STAGES)
    task, _ = receive_stage(local_stack, job_id)
    ref = claim_and_accept(local_stack, task, "mac-a", lease_ttl_sec=60)
    wait_for_run_token(ref)

    RelevoApi.for_stack(local_stack).cancel_job(job_id)

    stage = _stage(local_stack, job_id)
    assert stage["status"] == StageStatus.CANCELED.value and "held_by" not in stage
    with pytest.raises(stage_attempts.LeaseLost) as renewal:
        stage_attempts.renew_lease(ref, 60, _now())
    assert renewal.value.ended  # the holder learns why: the job ended, not a takeover
    # A redelivery of the message (its lease long gone) is refused as stale, not left to return.
    later = _now() + timedelta(seconds=120)
    with pytest.raises(stage_claims.ClaimRefused) as refused:
        stage_claims.claim(stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-b"), 60, later)
    assert not refused.value.held
    view = RelevoApi.for_stack(local_stack).get_job(job_id)
    assert [s["status"] for s in view["stages"]] == [
        "canceled",
        "skipped",
    ]  # nothing stays running or pending


def test_a_report_after_the_state_machine_gave_the_attempt_up_is_refused(local_stack, project_id):
    """The zombie of a partition: its lease ended by heartbeat, the next attempt is dispatched but
    not yet claimed. Its late success must not write over the stage."""
    job_id = start_job(
        local_stack,
        project_id,
        stages=[{"name": "deliver", "run": "true"}],
        lease_ttl_sec=3,
        retry={"backoff_base_sec": 0},
    )
    task, _ = receive_stage(local_stack, job_id)
    zombie = claim_and_accept(local_stack, task, "mac-zombie", lease_ttl_sec=3)
    wait_for_run_token(zombie)
    retry, _ = receive_stage(local_stack, job_id, timeout=30)  # attempt 2 dispatched, nobody claimed it
    assert retry["attempt"] == 2

    with pytest.raises(stage_attempts.LeaseLost):
        stage_attempts.finish(zombie, StageStatus.SUCCEEDED, _now(), 0, None)
    with pytest.raises(stage_attempts.LeaseLost):
        stage_attempts.renew_lease(zombie, 3, _now())
    assert _stage(local_stack, job_id)["status"] == StageStatus.DISPATCHED.value
    client("stepfunctions").send_task_failure(taskToken=retry["task_token"], error="Test.Cleanup", cause="")


def test_a_claim_sent_again_after_a_lost_answer_still_returns_what_the_previous_attempt_left(
    local_stack, project_id
):
    job_id = start_job(local_stack, project_id, stages=[{"name": "upload", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    now = _now()
    first = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-a")
    stage_claims.claim(first, 10, now, "commit=a;inputs=0")
    stage_attempts.finish(
        first,
        StageStatus.FAILED,
        now,
        -1,
        "Relevo.Transient.AgentShutdown",
        outcome=stage_attempts.AttemptOutcome.UNKNOWN,
    )
    second = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-b")
    claim_id = uuid.uuid4().hex

    landed = stage_claims.claim(second, 10, now, "commit=a;inputs=0", claim_id=claim_id)
    again = stage_claims.claim(second, 10, now, "commit=a;inputs=0", claim_id=claim_id)  # the answer was lost

    assert again == landed
    assert (again["attempt"], again["agent_id"], again["outcome"]) == (1, "mac-a", "unknown")
    assert stage_attempts.needs_reconcile(again, 2)
    # Another claimer of the same attempt, after the lease: refused, this claim holds it.
    with pytest.raises(stage_claims.ClaimRefused):
        stage_claims.claim(stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-c"), 10, now)
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_the_next_claimer_of_an_attempt_whose_claimer_lost_it_still_reconciles_the_attempt_before(
    local_stack, project_id
):
    """Attempt 1 left an unknown outcome (its agent was killed mid-stage). Attempt 2's first
    claimer lost its lease before the state machine took its claim (its accept was lost, as in
    the resets drill, or it died), so it ran nothing, and its message came back for another
    agent. That agent's claim of attempt 2 must still return attempt 1's unknown outcome, or it
    would run the stage without probing for attempt 1's effect: the claim used to return the
    first claimer's attempt 2 instead (needs_reconcile False)."""
    job_id = start_job(local_stack, project_id, stages=[{"name": "upload", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    long_ago = _now() - timedelta(seconds=120)
    first = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-a")
    stage_claims.claim(first, 10, long_ago, "commit=a;inputs=0")
    stage_attempts.finish(
        first,
        StageStatus.FAILED,
        long_ago,
        -1,
        "Relevo.Transient.AgentShutdown",
        outcome=stage_attempts.AttemptOutcome.UNKNOWN,
    )
    lost = stage_claims.claim(
        stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-b"),
        10,
        long_ago + timedelta(seconds=30),
    )
    assert stage_attempts.needs_reconcile(lost, 2)

    taken = stage_claims.claim(
        stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-c"), 10, _now()
    )

    assert (taken["attempt"], taken["agent_id"], taken["outcome"]) == (1, "mac-a", "unknown")
    assert stage_attempts.needs_reconcile(taken, 2)
    assert _stage(local_stack, job_id)["claimed_over"] == taken  # and so for a claimer after it
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_a_finished_attempt_is_never_claimed_again_and_its_report_can_be_repeated(local_stack, project_id):
    job_id = start_job(local_stack, project_id, stages=[{"name": "upload", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    now = _now()
    ref = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-a")
    stage_claims.claim(ref, 10, now)

    stage_attempts.finish(ref, StageStatus.FAILED, now, 2, "Relevo.Fatal.ExitCode")
    stage_attempts.finish(
        ref, StageStatus.FAILED, now, 2, "Relevo.Fatal.ExitCode"
    )  # its answer was lost: sent again

    stage = _stage(local_stack, job_id)
    assert stage["status"] == "failed"
    # The report ended the lease: a successor need not wait it out.
    assert datetime.fromisoformat(stage["lease_expires_iso"]) <= now + timedelta(seconds=1)
    with pytest.raises(stage_claims.ClaimRefused) as refused:  # a redelivery of attempt 1, long after
        stage_claims.claim(
            stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-b"),
            10,
            now + timedelta(seconds=60),
        )
    assert not refused.value.held
    assert _stage(local_stack, job_id)["status"] == "failed"
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_a_redelivery_while_the_attempt_is_held_is_left_to_come_back(local_stack, project_id):
    job_id = start_job(local_stack, project_id, stages=[{"name": "upload", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    stage_claims.claim(stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-a"), 60, _now())

    with pytest.raises(stage_claims.ClaimRefused) as refused:
        stage_claims.claim(stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-b"), 60, _now())

    assert refused.value.held
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_the_stage_of_an_execution_stopped_outside_relevo_is_canceled_by_the_sweep(
    local_stack, intake_settings, project_id
):
    from relevo_core.recovery.sweeper import sweep
    from tests.helpers.stack import wait_for_execution

    job_id = start_job(local_stack, project_id, stages=TWO_STAGES)
    task, _ = receive_stage(local_stack, job_id)
    ref = claim_and_accept(local_stack, task, "mac-a", lease_ttl_sec=60)
    wait_for_run_token(ref)
    client("stepfunctions").stop_execution(
        executionArn=job_execution_arn(local_stack, job_id), cause="console"
    )
    # moto 5.2.5 ends a stopped execution that waits for a task token as FAILED, AWS as ABORTED:
    # either way it ended with no last state, and the sweep ends its job and stage.
    assert wait_for_execution(local_stack, job_id, timeout=30)["status"] != "RUNNING"

    sweep(intake_settings, _now())

    stage = _stage(local_stack, job_id)
    assert (stage["status"], stage["last_writer"]) == ("canceled", "sweeper") and "held_by" not in stage
    with pytest.raises(stage_attempts.LeaseLost) as renewal:
        stage_attempts.renew_lease(ref, 60, _now())
    assert renewal.value.ended


def test_a_reset_before_the_claim_hands_the_message_back_at_once(local_stack, project_id, tmp_path):
    """Issue 14: a connection reset before the claim took crashed the handling, and the message
    waited out its 60 s visibility timeout, twice, until the job failed with Relevo.Timeout.Queue.
    The claim now goes through the claim route (issue 28): every try of it is reset here."""
    from relevo_agent.config import AgentConfig
    from relevo_agent.messages import Message
    from relevo_agent.service import Agent
    from relevo_tools.drill.proxy import FaultProxy, Mode

    job_id = start_job(
        local_stack, project_id, stages=[{"name": "upload", "run": "true"}], queue_timeout_sec=120
    )
    task, receipt = receive_stage(local_stack, job_id)
    api = local_stack.api_url.split("//", 1)[1].split("/", 1)[0]
    host, port = api.split(":")
    config = AgentConfig(
        agent_id="mac-reset", region="eu-west", workspace_root=tmp_path, journal=tmp_path / "j.sqlite3"
    )
    with FaultProxy((host, int(port))) as proxy:
        proxy.set_mode(Mode.RESET, reset_probability=1.0, resets_left=1000)
        agent = Agent(
            config, local_stack.table_name, local_stack.work_queues["eu-west"], api_url=f"{proxy.url}/v1"
        )
        handle_received(
            agent,
            Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
        )
        assert proxy.stats.resets >= 2  # sent again while its lease could still be kept, then given up

    again, _ = receive_stage(local_stack, job_id, timeout=20)  # visible again at once, well before its 60 s
    assert (again["attempt"], again["task_token"]) == (1, task["task_token"])
    assert "attempt" not in _stage(local_stack, job_id)  # nothing was claimed
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def _reading(attempt: int, files_done: int, bytes_done: int, state: str = "uploading") -> TransferProgress:
    return TransferProgress(
        attempt=attempt,
        state=state,
        files_done=files_done,
        files_total=3,
        bytes_done=bytes_done,
        bytes_total=3000,
        current_file=None if state != "uploading" else f"f{files_done}",
        updated_at=_now().isoformat(),
    )


def test_a_fenced_out_attempt_cannot_write_its_transfer_progress(local_stack, project_id):
    """Issue 18: an attempt's upload progress rides on its lease renewals and its end is written
    once, both fenced on the attempt. Once another attempt holds the stage, the old holder's
    readings are refused and leave the stage as its successor has it; each attempt keeps its own."""
    job_id = start_job(local_stack, project_id, stages=[{"name": "upload", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    now = _now()
    first = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-a")
    stage_claims.claim(first, 10, now)
    stage_attempts.renew_lease(first, 10, _now(), _reading(1, 1, 1000))
    # Its lease runs out; attempt 2 takes the stage and reports progress of its own
    second = stage_attempts.StageRef(local_stack.table_name, job_id, 0, 2, "mac-b")
    stage_claims.claim(second, 10, now + timedelta(seconds=60))
    stage_attempts.renew_lease(second, 10, _now(), _reading(2, 0, 500))

    with pytest.raises(stage_attempts.LeaseLost):
        stage_attempts.renew_lease(first, 10, _now(), _reading(1, 2, 2000))
    with pytest.raises(stage_attempts.LeaseLost):
        stage_attempts.record_transfer(first, _reading(1, 3, 3000, state="uploaded"))

    stage = _stage(local_stack, job_id)
    assert {
        attempt: (t["files_done"], t["bytes_done"], t["state"]) for attempt, t in stage["transfers"].items()
    } == {"1": (1, 1000, "uploading"), "2": (0, 500, "uploading")}
    view = RelevoApi.for_stack(local_stack).get_job(job_id)["stages"][0]
    assert [(t["attempt"], t["bytes_done"]) for t in view["transfers"]] == [(1, 1000), (2, 500)]
    assert view["transfer"]["attempt"] == 2  # the attempt the view shows
    # A reading of another attempt than the writer's is a mistake, not a write
    with pytest.raises(ValueError):
        stage_attempts.record_transfer(second, _reading(1, 3, 3000, state="uploaded"))
    stage_attempts.record_transfer(second, _reading(2, 3, 3000, state="uploaded"))
    assert _stage(local_stack, job_id)["transfers"]["2"]["state"] == "uploaded"
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_a_claim_fenced_before_its_accept_got_through_comes_back_when_its_lease_ends(
    local_stack, project_id, tmp_path, monkeypatch
):
    """The resets drill: a claim landed, but every answer to the dispatch (the accept) was lost
    until the holder's own clock fenced it, before its command started. The dispatch still
    waits, and only a claim of the same attempt can answer it: the message used to wait out the
    work queue's 60 s visibility timeout first, longer than the drill waits. It comes back just
    after the lease ends, the next claim of attempt 1 answers the dispatch, and nothing ran."""
    from botocore.exceptions import ConnectionClosedError

    from relevo_agent.claim_routes import RouteUnreachable
    from relevo_agent.config import AgentConfig
    from relevo_agent.journal import Journal, OperationOutcome, operation_id
    from relevo_agent.messages import Message
    from relevo_agent.service import Agent

    marker = tmp_path / "ran"
    lease_ttl_sec = 5
    job_id = start_job(
        local_stack,
        project_id,
        stages=[{"name": "upload", "run": f"touch {marker}"}],
        lease_ttl_sec=lease_ttl_sec,
        queue_timeout_sec=120,
    )
    task, receipt = receive_stage(local_stack, job_id)
    received = time.monotonic()

    def reset(*_: object, **__: object) -> None:
        raise ConnectionClosedError(endpoint_url=str(local_stack.aws_endpoint))

    def accept_lost(*_: object, **__: object) -> None:
        """The accept route as the agent sees it when every answer to it is reset."""
        raise RouteUnreachable("POST accepts: connection reset")

    # From the claim on, the accept and every lease renewal are reset, so the holder's own
    # clock fences it; reads, the claim and the message calls go through.
    real_renew = stage_attempts.renew_lease
    monkeypatch.setattr(stage_attempts, "renew_lease", reset)
    config = AgentConfig(
        agent_id="mac-lost",
        region="eu-west",
        workspace_root=tmp_path,
        journal=tmp_path / "j.sqlite3",
        max_clock_skew_sec=0.5,
    )
    agent = Agent(
        config,
        local_stack.table_name,
        local_stack.work_queues["eu-west"],
        Journal(config.journal),
        api_url=local_stack.api_url,
    )
    # The claim route's own answer to the dispatch got no answer either (it says it cannot tell):
    # the agent answers it, and every one of those answers is lost.
    routes, route_claim = agent.sessions.routes, agent.sessions.routes.claim
    routes.claim = lambda request: route_claim(request.model_copy(update={"accept": False}))
    real_accept = routes.accept
    routes.accept = accept_lost
    handle_received(
        agent,
        Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )

    assert agent.journal.get(operation_id(job_id, "upload")).outcome is OperationOutcome.ABANDONED
    assert _stage(local_stack, job_id)["agent_id"] == "mac-lost"
    routes.accept = real_accept
    monkeypatch.setattr(stage_attempts, "renew_lease", real_renew)
    again, _ = receive_stage(local_stack, job_id, timeout=30)
    back_after = time.monotonic() - received
    # Back once the lease ended (a claim of attempt 1 is refused before), well before 60 s.
    assert lease_ttl_sec <= back_after < 20, back_after
    assert (again["attempt"], again["task_token"]) == (1, task["task_token"])
    # The dispatch still waited: the next claim of attempt 1 answers it and gets its run token.
    ref = claim_and_accept(local_stack, again, "mac-next")
    assert wait_for_run_token(ref)
    assert not marker.exists()
    client("stepfunctions").stop_execution(executionArn=job_execution_arn(local_stack, job_id))
