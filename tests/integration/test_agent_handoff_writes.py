"""What the agent writes on its way from a stage message to the stage's command, counted (issue 29,
point 2: the stage handoff): each journal write is a commit with a full sync (relevo_agent.journal),
so one made twice is time between the claim and the command.

Given an in-process agent (relevo_agent.service) and a dispatched stage of a project without a
checkout, when the agent handles the stage's message, then the stage succeeds and the attempt's
precondition was journaled once: before anything ran, and not again when preparing the workspace
(nothing was checked out or restored) changed nothing of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relevo_agent.config import AgentConfig
from relevo_agent.journal import Journal
from relevo_agent.messages import Message
from relevo_agent.service import Agent
from tests.helpers.agents import handle_received
from tests.helpers.stack import receive_stage, wait_for_execution
from tests.helpers.state_machine import start_job

STAGES = [{"name": "build", "run": 'echo "built $RELEVO_JOB_ID"'}]


def test_a_stage_without_checkout_journals_its_precondition_once(
    local_stack, project_id, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    written: list[tuple[str, int, str]] = []
    set_precondition = Journal.set_precondition

    def counted(journal: Journal, operation_id: str, attempt: int, precondition: str) -> None:
        written.append((operation_id, attempt, precondition))
        set_precondition(journal, operation_id, attempt, precondition)

    monkeypatch.setattr(Journal, "set_precondition", counted)
    config = AgentConfig(
        agent_id="mac-writes",
        region="eu-west",
        capacity=1,
        workspace_root=tmp_path / "ws",
        journal=tmp_path / "j.sqlite3",
        max_clock_skew_sec=0.5,
    )
    agent = Agent(
        config, local_stack.table_name, local_stack.work_queues["eu-west"], api_url=local_stack.api_url
    )
    job_id = start_job(local_stack, project_id, STAGES)
    task, receipt = receive_stage(local_stack, job_id)

    handle_received(
        agent,
        Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )

    assert wait_for_execution(local_stack, job_id, timeout=60)["status"] == "SUCCEEDED"
    [(operation, attempt, precondition)] = written
    assert (operation, attempt) == (f"{job_id}:build", 1) and precondition
    assert agent.journal.get(operation).precondition_version == precondition
