"""A claim whose answer was lost is this agent's own (issue 42, finding 5): the route took the
claim (and answered the dispatch with it), the agent never heard so and handed the message back;
the message's next delivery to the same agent recognises the claim on the stage record (this
agent, this journal, the hash of the journaled claim secret) and resumes it at once, rather than
wait out a lease it holds itself. The command still runs once.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from relevo_agent.claim_routes import RouteError
from relevo_agent.config import AgentConfig
from relevo_agent.journal import Operation, OperationOutcome, operation_id
from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_core.aws import client
from relevo_core.store import stage_claims
from relevo_core.store.codec import from_attributes
from relevo_core.store.keys import stage_key
from tests.helpers.agents import handle_received
from tests.helpers.stack import receive_stage, wait_for_execution
from tests.helpers.state_machine import start_job


def _agent(tmp_path: Path, stack) -> Agent:
    config = AgentConfig(
        agent_id="mac-own",
        region="eu-west",
        capacity=1,
        workspace_root=tmp_path / "ws",
        journal=tmp_path / "j.sqlite3",
        max_clock_skew_sec=0.5,
        prefer_previous_sec=0,
        handoff_max_wait_sec=0,
    )
    return Agent(config, stack.table_name, stack.work_queues["eu-west"], api_url=stack.api_url)


def _message(agent: Agent, task: dict, receipt: str, receives: int) -> Message:
    return Message(
        agent.queue_url,
        {
            "Body": json.dumps(task),
            "ReceiptHandle": receipt,
            "MessageId": "m",
            "Attributes": {"ApproximateReceiveCount": str(receives)},
        },
    )


def test_a_claim_whose_answer_was_lost_is_resumed_by_its_agent_not_waited_out(
    local_stack, project_id, tmp_path, caplog
):
    # Given a stage whose command counts its runs, and an agent whose first claim lands on the
    # route (which answers the dispatch with it) while its answer is lost on the way back
    ran = tmp_path / "ran.txt"
    job_id = start_job(local_stack, project_id, stages=[{"name": "build", "run": f"echo once >> {ran}"}])
    agent = _agent(tmp_path, local_stack)
    routes = agent.sessions.routes
    claim = routes.claim
    sent: list = []

    def lost_once(request):
        sent.append(request.claim_secret)
        answer = claim(request)
        if len(sent) == 1:
            raise RouteError(
                504, None, "Endpoint request timed out"
            )  # the gateway gave up; the claim had landed
        return answer

    routes.claim = lost_once
    task, receipt = receive_stage(local_stack, job_id)
    handle_received(agent, _message(agent, task, receipt, 1))
    op_id = operation_id(job_id, "build")
    record = from_attributes(
        client("dynamodb").get_item(TableName=local_stack.table_name, Key=stage_key(job_id, 0))["Item"]
    )
    # (the stage record names this agent and its journal: the claim is there, nothing ran)
    assert (record["agent_id"], record["journal_id"], record["status"]) == (
        "mac-own",
        agent.journal.journal_id,
        "running",
    )
    assert agent.journal.get(op_id).outcome is OperationOutcome.UNANSWERED
    assert not ran.exists()

    # When the handed-back message comes to the same agent again
    caplog.set_level(logging.INFO, logger="relevo_agent")
    task, receipt = receive_stage(local_stack, job_id)
    handle_received(agent, _message(agent, task, receipt, 2))

    # Then it resumes its own claim at once (the same secret, a repeat the stage record takes):
    # the stage runs to its end, its command once, and no line says the attempt is held by itself
    assert sent[-1] == sent[0]
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    assert ran.read_text() == "once\n"
    assert "is held by mac-own" not in caplog.text
    assert "resumed" in caplog.text
    done = stage_claims.claim_on_record(local_stack.table_name, job_id, 0, None)
    assert (done.status, done.attempt, done.agent_id) == ("succeeded", 1, "mac-own")


def test_a_claim_another_agent_holds_is_still_waited_out(local_stack, project_id, tmp_path):
    # Given a stage claimed by another agent (its claim secret unknown here), and this agent's
    # journal holding an unanswered claim of the same attempt
    from relevo_agent.claim import new_claim_secret
    from relevo_core.models.agent_session import ClaimRequest

    job_id = start_job(local_stack, project_id, stages=[{"name": "build", "run": "true"}])
    agent = _agent(tmp_path, local_stack)
    task, receipt = receive_stage(local_stack, job_id)
    agent.sessions.routes.claim(
        ClaimRequest(
            job_id=job_id,
            stage_index=0,
            attempt=1,
            agent_id="mac-other",
            claim_secret=new_claim_secret(),
            dispatch_key=task["dispatch_key"],
            dispatch_token=task["task_token"],
            accept=False,
        )
    )
    op_id = operation_id(job_id, "build")
    agent.journal.begin(
        Operation(op_id, job_id, "build", 0, 1, str(tmp_path), "", claim_secret=new_claim_secret())
    )
    agent.journal.record(
        op_id, 1, OperationOutcome.UNANSWERED, None, None
    )  # a claim of its own that never landed
    resumed: list = []
    claim = agent.sessions.routes.claim
    agent.sessions.routes.claim = lambda request: resumed.append(request) or claim(request)

    # When the message comes to this agent
    handle_received(agent, _message(agent, task, receipt, 2))

    # Then it is refused and nothing is resumed: one claim was sent, with a secret of its own
    assert len(resumed) == 1
    assert agent.journal.get(op_id).outcome is OperationOutcome.ABANDONED
    held = stage_claims.claim_on_record(local_stack.table_name, job_id, 0, None)
    assert (held.agent_id, held.status) == ("mac-other", "running")
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_a_claim_sent_again_after_a_lost_answer_runs_its_stage_once(local_stack, project_id, tmp_path):
    # Given an agent whose claim lands while its answer is lost (a reset), so that it sends the
    # same claim again at once: the route's answer to the dispatch was the first send's
    from relevo_agent.claim_routes import RouteUnreachable

    ran = tmp_path / "ran.txt"
    job_id = start_job(local_stack, project_id, stages=[{"name": "build", "run": f"echo once >> {ran}"}])
    agent = _agent(tmp_path, local_stack)
    claim = agent.sessions.routes.claim
    answers: list = []

    def reset_once(request):
        answers.append(claim(request))
        if len(answers) == 1:
            raise RouteUnreachable("connection reset by peer")
        return answers[-1]

    agent.sessions.routes.claim = reset_once

    # When it handles the stage
    task, receipt = receive_stage(local_stack, job_id)
    handle_received(agent, _message(agent, task, receipt, 1))

    # Then the repeat could not tell whether the dispatch took it (the first send answered it),
    # and the run token the state machine handed that claim decides: the command ran, once
    assert [answer.accepted for answer in answers] == [True, None]
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    assert ran.read_text() == "once\n"
