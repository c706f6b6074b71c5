"""An agent's job credentials (relevo_agent.job_sessions) on the local stack: a stage runs with the
session its claim came with, never sees it, and the agent renews it before it runs out.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from relevo_agent.claim import new_claim_secret
from relevo_agent.config import AgentConfig
from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_core.models.agent_session import ClaimRequest
from tests.helpers.agents import handle_received
from tests.helpers.iam import client_as
from tests.helpers.stack import receive_stage, wait_for_execution
from tests.helpers.state_machine import start_job


def _agent(tmp_path: Path, stack) -> Agent:
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
    return Agent(config, stack.table_name, stack.work_queues["eu-west"], api_url=stack.api_url)


def test_a_stage_sees_neither_the_agents_credentials_nor_its_jobs(local_stack, project_id, tmp_path):
    seen = tmp_path / "env.txt"
    job_id = start_job(local_stack, project_id, stages=[{"name": "build", "run": f"env > {seen}"}])
    agent = _agent(tmp_path, local_stack)
    granted: list = []
    routes = agent.sessions.routes
    claim = routes.claim
    routes.claim = (
        lambda request: granted.append(claim(request)) or granted[-1]
    )  # what the agent got, for the test to look for
    task, receipt = receive_stage(local_stack, job_id)
    handle_received(
        agent,
        Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    env = seen.read_text()
    [answer] = granted
    own = local_stack.agent_credentials["eu-west"]
    for secret in (
        answer.session.access_key_id,
        answer.session.secret_access_key,
        answer.session.session_token,
        own.access_key_id,
        own.secret_access_key,
        str(own.session_token),
    ):
        assert secret not in env
    assert not [
        line
        for line in env.splitlines()
        if line.startswith("AWS_") and not line.startswith(("AWS_REGION=", "AWS_DEFAULT_REGION="))
    ]
    # Its report sent, the attempt's credentials were let go.
    assert agent.sessions.held() == []


def test_the_agent_renews_a_session_before_it_runs_out_and_the_new_one_works(
    local_stack, project_id, tmp_path
):
    job_id = start_job(local_stack, project_id, stages=[{"name": "build", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    agent, secret = _agent(tmp_path, local_stack), new_claim_secret()
    granted = agent.sessions.routes.claim(
        ClaimRequest(
            job_id=job_id,
            stage_index=0,
            attempt=1,
            agent_id="mac-s",
            claim_secret=secret,
            dispatch_key=task["dispatch_key"],
            dispatch_token=task["task_token"],
            accept=False,
        )
    )
    key = (job_id, 0, 1)
    credentials = agent.sessions.granted(key, secret, granted.session)
    agent.sessions.renew_due()  # fresh: nothing due
    assert credentials.current.access_key_id == granted.session.access_key_id
    # Less than a third of its life left (as if granted long ago): renewed, the attempt's clients with it.
    agent.sessions._held[key].granted_at = datetime.now(UTC) - timedelta(hours=2)
    agent.sessions.renew_due()
    renewed = credentials.current
    assert renewed.access_key_id != granted.session.access_key_id
    dynamodb = client_as(
        local_stack, "dynamodb", renewed.access_key_id, renewed.secret_access_key, renewed.session_token
    )
    assert dynamodb.get_item(
        TableName=local_stack.table_name, Key={"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "JOB"}}
    )["Item"]
    from relevo_core.aws import client

    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_the_claim_route_answers_the_dispatch_and_a_repeat_of_the_claim_cannot_tell(
    local_stack, project_id, tmp_path
):
    """The route answers the dispatch with the claim it made (the agent's command then starts
    without a round trip of its own). The same claim sent again (its answer lost on the way back)
    finds the dispatch answered: by this very claim, so it says it cannot tell, and the agent
    watches for its run token rather than give the stage up."""
    from relevo_agent.claim_routes import RouteError
    from relevo_core.store import stage_attempts
    from tests.helpers.state_machine import wait_for_run_token

    job_id = start_job(local_stack, project_id, stages=[{"name": "build", "run": "true"}])
    task, _ = receive_stage(local_stack, job_id)
    routes = _agent(tmp_path, local_stack).sessions.routes
    request = ClaimRequest(
        job_id=job_id,
        stage_index=0,
        attempt=1,
        agent_id="mac-s",
        claim_secret=new_claim_secret(),
        dispatch_key=task["dispatch_key"],
        dispatch_token=task["task_token"],
        project=project_id,
        signs=False,
    )
    assert routes.claim(request).accepted is True
    assert wait_for_run_token(stage_attempts.StageRef(local_stack.table_name, job_id, 0, 1, "mac-s"))
    assert routes.claim(request).accepted is None
    other = request.model_copy(update={"agent_id": "mac-t", "claim_secret": new_claim_secret()})
    try:
        routes.claim(other)
    except RouteError as refused:
        assert (refused.status, refused.code, refused.details.get("agent_id")) == (
            409,
            "CLAIM_REFUSED",
            "mac-s",
        )
    else:
        raise AssertionError("a second claim of a held attempt was not refused")
    # A message that says otherwise than its job (the project, signing) claims nothing.
    for changed in ({"project": "another"}, {"signs": True}):
        try:
            routes.claim(request.model_copy(update=changed))
        except RouteError as refused:
            assert (refused.status, refused.code) == (404, "DISPATCH_NOT_FOUND"), changed
        else:
            raise AssertionError(f"{changed} was claimed")
