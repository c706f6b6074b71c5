"""Which next stages the claim route offers to the Mac that ran the stage before (issue 42,
finding 4): only one whose Mac holds files the next stage restores. A stage with nothing to
reuse (archive -> notify) goes to whichever Mac looked first, with no hand-back at all.
"""

from __future__ import annotations

import json

import pytest

from relevo_agent.claim import new_claim_secret
from relevo_agent.claim_routes import RouteError
from relevo_agent.messages import Message
from relevo_core.aws import client
from relevo_core.models.agent_session import ClaimRequest
from tests.helpers.agents import agent_at, handle_received
from tests.helpers.stack import receive_stage
from tests.helpers.state_machine import start_job


@pytest.mark.parametrize(
    ("archive", "offered"),
    [
        ({"name": "archive", "run": "true"}, False),
        ({"name": "archive", "run": "mkdir -p out && echo built > out/app", "handoff": ["out"]}, True),
    ],
    ids=["nothing-handed-on", "files-handed-on"],
)
def test_a_next_stage_is_offered_to_the_previous_mac_only_when_files_wait_there(
    local_stack, project_id, tmp_path, archive, offered
):
    # Given a job whose archive stage ran on mac-x
    job_id = start_job(local_stack, project_id, stages=[archive, {"name": "notify", "run": "true"}])
    mac_x = agent_at(tmp_path, local_stack, "mac-x")
    task, receipt = receive_stage(local_stack, job_id)
    handle_received(
        mac_x,
        Message(mac_x.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )

    # When mac-y, another Mac, claims notify asking to leave it to the previous stage's Mac
    task, _ = receive_stage(local_stack, job_id)
    assert task["stage"] == "notify"
    request = ClaimRequest(
        job_id=job_id,
        stage_index=1,
        attempt=1,
        agent_id="mac-y",
        claim_secret=new_claim_secret(),
        dispatch_key=task["dispatch_key"],
        dispatch_token=task["task_token"],
        accept=False,
        leave_to_previous=True,
        project=project_id,
        signs=False,
    )
    try:
        granted = agent_at(tmp_path, local_stack, "mac-y").sessions.routes.claim(request)
    except RouteError as refused:
        # Then with files handed on, the route names mac-x (the agent may leave the stage to it)
        assert offered, f"a stage with nothing to reuse was offered to the previous Mac: {refused}"
        assert (refused.status, refused.code, refused.details.get("agent_id")) == (
            409,
            "PREVIOUS_AGENT_PREFERRED",
            "mac-x",
        )
    else:
        # Then with nothing handed on, mac-y has it at once
        assert not offered, "a stage whose previous Mac holds its files was not offered to it"
        assert granted.previous is not None
    client("stepfunctions").send_task_failure(taskToken=task["task_token"], error="Test.Cleanup", cause="")


def test_files_wait_on_a_mac_that_handed_them_on_or_restored_them():
    from relevo_core.fleet.claims import holds_files

    assert not holds_files({})
    assert not holds_files({"receipt": {"handoff": {"files": 0, "symlinks": 0, "dirs": 3}}})
    assert holds_files({"receipt": {"handoff": {"files": 2}}})
    assert holds_files({"handoff_stored": {"files": 0, "symlinks": 1}})
    assert holds_files({"restored": {"from_stages": ["build"], "files": 1834, "restored_bytes": 0}})
    assert not holds_files({"restored": {"from_stages": [], "files": 0}, "receipt": "not a map"})
