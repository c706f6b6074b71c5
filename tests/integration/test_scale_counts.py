"""The counted parts of the fleet's figures (issue 47, point 3): bench/scale.py scales a job's calls
per API and its write units per key to 1,000 Macs; here those per-job and per-renewal counts are
pinned, so that a change that adds a call per job or a write on a hot key fails a test, not only
the bench nobody reads.

Given the embedded stack, every request it serves recorded (bench/scale.py Served_Log, the
bench's own recording) and a project of 4 stages whose second runs in 4 shards (7 stage runs),
when one job goes through the bench's own drive (a signed push through the webhook function, each
stage message claimed through the claim route, 2 log chunks shipped with the job's session, the
outcome reported through the outcome route) and an attempt of another project's job is renewed
14 times as the agent's keeper renews it (the lease every 3 s, the task heartbeat every 20 s:
every 7th renewal, the default lease of 60 s), then each API's calls and each key's write units
are the figures below (DynamoDB's rules and the items' sizes as stored, bench/scale.py
units_by_key). Calls whose number depends on timing (an agent's receives, its look for the run
token) are not pinned; reads are not (the look is a read).

A figure that moves is a decision: a change that lowers one updates it here and says why in its
commit; one that raises a hot key's (COUNTER#queued: every job of the fleet; LOCK#, DELIVERIES#:
every job of a project) or an API's that is short (SendTaskSuccess, AssumeRole) answers to the
bench's headroom first (docs/architecture.md "Scale").
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench import harness, scale
from relevo_core.models.project import Project

# One job of 4 stages, the second in 4 shards: 7 stage runs. Each run: a claim (its job session,
# one AssumeRole, and its answer to the dispatch, a SendTaskSuccess), an outcome (the run token
# answered, a SendTaskSuccess), its stage message (a SendMessage by the state machine).
PER_JOB_CALLS = {
    "route:claims": 7.0,
    "route:outcomes": 7.0,
    "route:webhook": 1.0,
    "sqs:SendMessage": 7.0,
    "states:SendTaskSuccess": 14.0,
    "states:StartExecution": 1.0,
    "sts:AssumeRole": 7.0,
}
# Write units by key: the fleet's one key (COUNTER#queued: the intake's slot and the start's
# release, 2 units each in a transaction), the project's (its lock taken and released, its
# deliveries' record), one request's (a delivery's dedup, id and frozen-key check), the job's own.
# No COUNTER#queued: the job took its project's free lock at intake, no queue slot.
PER_JOB_WRITE_UNITS = {
    "DEDUP#<project>:<id>:<id>": 2.0,
    "DELIVERIES#<project>": 2.0,
    "DELIVERY#github#<id>": 2.0,
    "FREEZE#<project>:<id>:<id>": 2.0,
    # The job record: its two transactional writes (intake, end) and the rest, within 2 KB each
    # since its envelope is stored packed (a queued job's start is one more: 19).
    "JOB#<job>": 16.0,
    "LOCK#<project>": 4.0,
    "LOGS#<job>": 12.0,
    "LOGS#<job>/01/00": 4.0,
    "LOGS#<job>/01/01": 4.0,
    "LOGS#<job>/01/02": 4.0,
    "LOGS#<job>/01/03": 4.0,
    "STAGES#<job>": 67.0,
    "TOKENS#<job>": 14.0,
}
# 14 renewals, 2 of them with the task's heartbeat (through the heartbeat route): each renewal
# the lease's one fenced write on its stage record.
RENEWALS = 14
PER_RENEWAL_CALLS = {"route:heartbeats": 0.14, "states:SendTaskHeartbeat": 0.14}
PER_RENEWAL_WRITE_UNITS = {"STAGES#<job>": 1.0}


@pytest.fixture()
def served(local_stack) -> Iterator[scale.Served_Log]:
    with scale.Served_Log().recording() as log:
        yield log


def test_a_job_and_a_held_attempts_renewals_make_the_calls_and_writes_the_fleet_figures_count(
    local_stack, served
):
    # Given a project of 4 stages with one in 4 shards and one of 4 plain stages, both with the
    # default lease, registered through the API
    lease = Project.model_fields["lease_ttl_sec"].default
    harness.use_function_environment(local_stack, "WebhookFunction")
    sharded = scale.registered(local_stack, "counts", scale.SHARDED, lease)
    renewer = scale.registered(local_stack, "counts-renew", scale.PLAIN, lease)

    # When one job of the first runs through the bench's drive, and an attempt of the second's
    # job is renewed as the keeper renews it
    counted = scale.drive(local_stack, served, [sharded], renewer, jobs=1, chunks=2, renewals=RENEWALS)

    # Then the job made exactly these calls and wrote exactly these units, key by key
    assert len(counted.job_ids) == 1
    assert scale.calls_per(counted.jobs, 1) == PER_JOB_CALLS
    assert scale.write_units_per(counted.jobs, 1, counted) == PER_JOB_WRITE_UNITS
    # and each renewal these (the heartbeat every 7th: 2 of 14)
    assert counted.beats == 2
    assert scale.calls_per(counted.renewals, RENEWALS) == PER_RENEWAL_CALLS
    assert scale.write_units_per(counted.renewals, RENEWALS, counted) == PER_RENEWAL_WRITE_UNITS
