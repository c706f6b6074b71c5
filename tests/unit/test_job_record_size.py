"""The job record's size at each of its writes on a job's path. DynamoDB charges a write by the
whole item, the larger of before and after for an update, 1 KB a write unit and twice that in a
transaction ("DynamoDB read and write operations", Capacity unit consumption for write
operations, DynamoDB Developer Guide); the record is written three times in transactions (the
intake's, the start's, the end's), and each index that projects it ALL (ProjectJobsIndex,
JobStatusIndex) writes it again. With the envelope packed (store/codec) a four-stage job's record
stays within 2 KB at each: 4 units a write, not the 6 of its 3 KB with the envelope as a map."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from bench.cost import item_size
from relevo_core.models.envelope import JobEnvelope, Trigger, TriggerType, new_job_id
from relevo_core.models.plan import StagePlan
from relevo_core.models.status import JobStatus
from relevo_core.store.codec import to_attributes
from relevo_core.store.job_creation import job_item

WRITE_UNIT = 1024
RECORD_BOUND = 2 * WRITE_UNIT
STAGES = ("build", "test", "sign", "upload")


def _four_stage_envelope() -> JobEnvelope:
    now = datetime(2026, 12, 6, 17, 0, tzinfo=UTC)
    job_id = new_job_id(now.timestamp())
    commit = "8ec9088d76d9f0983eb3fb3b04f99dafb0c2ff86"
    return JobEnvelope(
        job_id=job_id,
        idempotency_key=f"cost-726214:{commit}:6ee48f6e6ddbba04",
        project="cost-726214",
        region_affinity="eu-west",
        artifact_uri=f"s3://relevo-artifactbucket-2y3ly3thx0cp/cost-726214/{job_id}/",
        created_at=now,
        ttl=1_799_169_818,
        log_ttl=1_797_787_418,
        trigger=Trigger(
            type=TriggerType.WEBHOOK,
            source="github",
            delivery_id="027af5e2-c057-4a0d-bd0d-6e61cd1db62f",
            actor="ci",
        ),
        ref="refs/heads/main",
        commit=commit,
        stages=tuple(StagePlan(name=name, command="true") for name in STAGES),
    )


def test_a_four_stage_jobs_record_stays_within_two_kilobytes_at_each_write():
    # Given a four-stage job's envelope as a push makes it (the bench's job: bench/cost.py)
    envelope = _four_stage_envelope()
    now = envelope.created_at.isoformat()

    # When its record is written by the intake, moved to running by the start (its start-pending
    # mark removed) and ended by the last state with every stage's outcome
    intake = job_item(envelope, JobStatus.QUEUED, envelope.created_at)
    started = {k: v for k, v in intake.items() if k != "start_pending"} | {
        "status": "running",
        "updated_at": now,
        "last_writer": "state_machine:AcquireProjectLockAndStart",
    }
    outcomes = [
        {"stage": s, "attempt": 1, "agent_id": "cost-double-1", "status": "succeeded"} for s in STAGES
    ]
    ended = started | {
        "status": "succeeded",
        "ended_at": now,
        "last_writer": "state_machine:ReleaseLockAndMarkSucceeded",
        "last_successful_stage": STAGES[-1],
        "stage_outcomes": json.dumps(outcomes, separators=(",", ":")),
    }

    # Then at each write the record is within 2 KB by DynamoDB's size rules
    sizes = {name: item_size(to_attributes(item)) for name, item in (("intake", intake), ("ended", ended))}
    assert all(size <= RECORD_BOUND for size in sizes.values()), sizes
