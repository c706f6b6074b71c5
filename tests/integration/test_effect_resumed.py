"""A probe that says "in progress" (exit 118), through the local stack with the real agent code:
the next attempt runs the stage's effect_resume, under the same operation id, with the previous
attempt's values, once, and never the stage's command again (issue 44, point 1)."""

from __future__ import annotations

import json
import threading

import pytest

from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_cli.api import RelevoApi
from relevo_core.store.codec import from_attributes
from tests.helpers.agents import agent_at, handle_received
from tests.helpers.stack import job_items, receive_stage, wait_for_execution, wait_until

pytestmark = pytest.mark.timeout(240)


def _run_next(stack, agent: Agent, job_id: str) -> dict:
    task, receipt = receive_stage(stack, job_id, timeout=30)
    handle_received(
        agent,
        Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )
    return task


def _stage(stack, job_id: str) -> dict:
    items = [from_attributes(i) for i in job_items(stack, job_id)]
    # {} until the stage is dispatched.
    return next((item for item in items if item.get("stage_name") == "notarize"), {})


def test_a_submission_in_progress_is_resumed_once_never_submitted_again(local_stack, project_id, tmp_path):
    # Given a notarize stage that submits (the effect: a line naming its operation), records the
    # submission id at once, then waits; a probe that finds the recorded submission still in
    # progress (exit 118, printing the submission's line, which names the operation); and a resume
    # that waits for that submission and says what it resumed
    submitted, resumed = tmp_path / "submitted", tmp_path / "resumed"
    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 60,
            "retry": {"backoff_base_sec": 0},
            "stages": [
                {
                    "name": "notarize",
                    "run": f'echo "$RELEVO_OPERATION_ID sub-$RELEVO_JOB_ID" >> {submitted}; '
                    'echo "submission_id=sub-$RELEVO_JOB_ID" >> "$RELEVO_OUTPUT"; sleep 30',
                    "effect_probe": f'grep -F "$RELEVO_PREVIOUS_OUT_SUBMISSION_ID" {submitted} || exit 1; '
                    "exit 118",
                    "effect_resume": f'echo "$RELEVO_OPERATION_ID $RELEVO_PREVIOUS_OUT_SUBMISSION_ID '
                    f'resume=$RELEVO_RESUME attempt=$RELEVO_ATTEMPT" >> {resumed}; '
                    'echo "status=Accepted" >> "$RELEVO_OUTPUT"',
                    "exec_timeout_sec": 60,
                    "kill_grace_sec": 1,
                }
            ],
        },
    )
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    mac_a = agent_at(tmp_path, local_stack, "mac-a")
    runner = threading.Thread(target=_run_next, args=(local_stack, mac_a, job_id), daemon=True)
    runner.start()
    wait_until(
        lambda: _stage(local_stack, job_id).get("outputs", {}).get("submission_id"),
        30,
        "the submission id on record",
    )

    # When its Mac's agent is shut down mid-wait (the outcome unknown) and another Mac takes attempt 2
    mac_a.stages.stop_all("shutdown")
    runner.join(timeout=30)
    task = _run_next(local_stack, agent_at(tmp_path, local_stack, "mac-b"), job_id)

    # Then attempt 2 resumed the submission (its effect_resume ran once, with the recorded id) and
    # the stage's command never ran again: Apple got one submission
    assert task["attempt"] == 2
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    operation = f"{job_id}:notarize"
    assert submitted.read_text().splitlines() == [f"{operation} sub-{job_id}"]
    assert resumed.read_text().splitlines() == [f"{operation} sub-{job_id} resume=1 attempt=2"]
    stage = _stage(local_stack, job_id)
    assert stage["reconciled"]["decision"] == "resume", stage["reconciled"]
    assert stage["reconciled"]["evidence"]["probe_exit"] == 118
    assert f"sub-{job_id}" in stage["reconciled"]["evidence"]["probe_output"]
    # The resume's result is the stage's, as a run's would be: its values, the submission id carried on
    assert (stage["status"], stage["attempt"]) == ("succeeded", 2)
    assert stage["receipt"]["outputs"] == {"submission_id": f"sub-{job_id}", "status": "Accepted"}
