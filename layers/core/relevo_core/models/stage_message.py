"""The stage message: what the job state machine puts on a region's work queue for one attempt of
a stage (or of one shard of it), and what relevo-agent reads before it claims.

One contract: the state machine's builder derives the message body from these fields
(relevo_tools.job_machine.dispatch, message_body), and a field added here without a source there
fails the build; tests/integration/test_stage_message_contract.py parses what the generated
definition sends, a stage's and a shard's, into this model, every field.
"""

# Annotations are evaluated as written (no `from __future__ import annotations`), as in plan.py.

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field


class StageMessage(BaseModel):
    """What the state machine puts on a region's work queue: one attempt of a stage or a shard.

    Field order is the body's order in statemachines/job.asl.json. Defaults exist for messages of
    executions started before a field existed; the state machine sends every field (a plain
    stage's leaves out `shard` only: SHARD_ONLY)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    # The fields only a shard's message carries; every other field is in every message.
    SHARD_ONLY: ClassVar[frozenset[str]] = frozenset({"shard"})

    job_id: str = Field(description="The job the attempt belongs to.")
    stage: str = Field(description="The stage's name in the job's frozen plan.")
    stage_index: int = Field(description="The stage's position in the plan, from 0.")
    attempt: int = Field(description="1, 2, ...: the fencing token of this attempt.")
    task_token: str = Field(
        description="Answers the dispatch (the claim); the run has a token of its own, never sent here."
    )
    avoid_agents: tuple[str, ...] = Field(
        default=(),
        description="Retries only: the agents that ran the failed attempts, which leave it to another "
        "agent of the region if one is online.",
    )
    queue_timeout_sec: int | None = Field(
        default=None, description="How long the attempt may wait for a claim (the queue timeout)."
    )
    requires: dict[str, str] = Field(
        default_factory=dict,
        description="What the claiming agent must have (relevo_core.models.capabilities); empty: any "
        "agent of the region.",
    )
    dispatch_key: str = Field(
        description="The claim route claims the attempt only for a caller that shows this key."
    )
    project: str = Field(description="The project, whose workspace the agent checks before it claims.")
    lease_ttl_sec: int = Field(
        description="The lease an agent holds while it runs the attempt: it decides before the claim "
        "whether the lease leaves room to renew before the fence (the kill grace, from the envelope, "
        "is checked after)."
    )
    signs: bool = Field(
        default=False, description="Whether the plan signs: a signing stage runs alone on its Mac."
    )
    shard: int | None = Field(
        default=None,
        description="The shard of a stage with shards, from 0: its own record, claim and operation. "
        "Absent (None) for a stage without shards.",
    )

    @classmethod
    def sent_fields(cls, shard: bool) -> list[str]:
        """The fields the state machine sends, in order: a shard's message, or a plain stage's."""
        return [name for name in cls.model_fields if shard or name not in cls.SHARD_ONLY]
