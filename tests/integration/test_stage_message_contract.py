"""The stage message is one contract: what statemachines/job.asl.json sends to a region's work
queue, a stage's and a shard's, is relevo_core.models.stage_message.StageMessage, every field.

The agent's parse alone cannot tell: the model has defaults (for messages of executions started
before a field existed), so a field the machine stopped sending would parse as its default -- a
stage's `requires` as {} (any Mac), `avoid_agents` as () (no retry placement) -- without an error.
Here each message is read raw off the queue, as the emulator's Step Functions interpreter sent it
from the generated definition, and must carry every field the model has, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relevo_core.models.stage_message import StageMessage
from tests.helpers.stack import receive_stage
from tests.helpers.state_machine import agent_runs, start_job
from tests.integration.test_parallel_stages import stage_messages

ASL = Path(__file__).resolve().parents[2] / "statemachines" / "job.asl.json"
POOL = {"pool": "contract"}
STAGES = [
    {"name": "build", "run": "make build", "requires": POOL},
    {"name": "test", "run": "make test", "parallel": 2, "requires": POOL},
]


def _message_bodies(states: dict[str, Any], scope: str = "") -> dict[str, dict[str, Any]]:
    """Every MessageBody the definition sends to a work queue, by state (Map scopes included)."""
    found = {}
    for name, state in states.items():
        parameters = state.get("Parameters")
        if state.get("Resource", "").startswith("arn:aws:states:::sqs:sendMessage.waitForTaskToken"):
            found[scope + name] = parameters["MessageBody"]
        if state["Type"] == "Map":
            found |= _message_bodies(state["ItemProcessor"]["States"], f"{scope}{name}/")
    return found


def _parsed(body: dict[str, Any], shard: bool) -> StageMessage:
    """The body as the agent parses it, after checking it carries every field it should."""
    assert sorted(body) == sorted(StageMessage.sent_fields(shard)), "the message's fields are the model's"
    message = StageMessage.model_validate_json(json.dumps(body))
    assert message.model_fields_set == set(StageMessage.sent_fields(shard)), "no field left to its default"
    return message


def test_the_generated_definition_dispatches_the_models_fields_for_a_stage_and_for_a_shard():
    # Given the committed definition
    bodies = _message_bodies(json.loads(ASL.read_text())["States"])

    # Then it sends two stage messages, a stage's and (inside the fan-out's Map) a shard's
    assert sorted(bodies) == ["RunStages/DispatchStage", "RunStages/RunShards/ShardDispatchStage"]
    # and each names every field the model has (a stage's all but the shard's own), nothing else
    stage_fields = [key.removesuffix(".$") for key in bodies["RunStages/DispatchStage"]]
    shard_fields = [key.removesuffix(".$") for key in bodies["RunStages/RunShards/ShardDispatchStage"]]
    assert stage_fields == StageMessage.sent_fields(shard=False)
    assert shard_fields == StageMessage.sent_fields(shard=True) == list(StageMessage.model_fields)


def test_what_the_machine_sends_for_a_stage_and_each_shard_parses_into_the_model_with_every_field(
    local_stack, project_id
):
    # Given a job whose first stage runs alone and whose second has two shards, both with requirements
    job_id = start_job(local_stack, project_id, STAGES)

    # When the machine dispatches the first stage
    body, _ = receive_stage(local_stack, job_id)

    # Then its message is the model's, every field sent and taken from the job's state
    stage = _parsed(body, shard=False)
    assert (stage.job_id, stage.stage, stage.stage_index, stage.attempt) == (job_id, "build", 0, 1)
    assert (stage.project, stage.requires, stage.avoid_agents) == (project_id, POOL, ())
    assert (stage.queue_timeout_sec, stage.lease_ttl_sec, stage.signs) == (30, 10, False)
    assert stage.task_token and stage.dispatch_key and stage.shard is None

    # When that stage succeeds and the second fans out over its shards
    agent_runs(local_stack, body)
    shard_bodies = stage_messages(local_stack, job_id, 2)

    # Then each shard's message is the model's too, its shard included
    shards = [_parsed(shard_body, shard=True) for shard_body in shard_bodies]
    assert [(task.stage, task.stage_index, task.shard, task.attempt) for task in shards] == [
        ("test", 1, 0, 1),
        ("test", 1, 1, 1),
    ]
    assert all(
        (task.job_id, task.project, task.requires, task.avoid_agents) == (job_id, project_id, POOL, ())
        for task in shards
    )
    assert all((task.queue_timeout_sec, task.lease_ttl_sec, task.signs) == (30, 10, False) for task in shards)
    assert len({stage.dispatch_key, *(task.dispatch_key for task in shards)}) == 3, "each its own key"
