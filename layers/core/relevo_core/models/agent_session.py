"""What an agent and the claim routes (POST /regions/{region}/claims and /sessions) say to each
other: the claim of a dispatched stage attempt, and the job credentials it is answered with.

The claim secret is the agent's proof, from then on, that it is the one that claimed the attempt:
random, kept in its journal, never stored by Relevo (the stage record keeps its SHA-256 as
`claim_id`), and asked for again to renew the job's credentials or to resume them after a restart.
"""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic models.

import hashlib
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from relevo_core.models.envelope import JOB_ID
from relevo_core.models.plan import MAX_DECLARED_SHARDS
from relevo_core.models.requests import BodyModel
from relevo_core.models.test_results import ResultsSummary

CLAIM_SECRET = r"^[0-9a-f]{64}$"
# States.UUID() of the dispatch (statemachines/job.asl.json MarkStageDispatched).
DISPATCH_KEY = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


def claim_id_of(claim_secret: str) -> str:
    """What the stage record keeps of a claim secret (the secret itself is the agent's alone)."""
    return hashlib.sha256(claim_secret.encode()).hexdigest()[:32]


class AttemptRequest(BodyModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=JOB_ID)
    stage_index: int = Field(ge=0, le=99)
    # The shard of a stage with shards, as its stage message names it (its own record); None
    # for a stage without.
    shard: int | None = Field(default=None, ge=0, le=MAX_DECLARED_SHARDS - 1)
    attempt: int = Field(ge=1, le=1000)
    agent_id: str = Field(min_length=1, max_length=128)
    claim_secret: str = Field(pattern=CLAIM_SECRET)


class ClaimRequest(AttemptRequest):
    """POST /regions/{region}/claims: claim the attempt a stage message of that region names."""

    dispatch_key: str = Field(pattern=DISPATCH_KEY)
    # The dispatch's task token: answered with the claim (`accept`), or failed when the job is
    # gone or unreadable.
    dispatch_token: str = Field(min_length=1, max_length=2048)
    journal_id: str = Field(default="", max_length=64)
    # The workspace's precondition as the agent found it (reconciliation compares it).
    precondition_version: str = Field(default="", max_length=200)
    # When the queue accepted the message (SQS SentTimestamp).
    enqueued_at: datetime | None = None
    # A job's next stage prefers the Mac that ran the stage before it: when that stage ran on
    # another agent, the claim is not made and the answer names that agent (PREVIOUS_AGENT_PREFERRED).
    leave_to_previous: bool = False
    # What the stage message said of its job, on which the agent decided before claiming (its
    # workspace, whether it runs alone): a claim is refused when the job says otherwise.
    project: str | None = Field(default=None, max_length=63)
    signs: bool | None = None
    # Answer the dispatch with this claim once it is made (one round trip fewer for the agent,
    # whose command starts once the dispatch took its claim). False: the caller answers it.
    accept: bool = True


class SessionRequest(AttemptRequest):
    """POST /regions/{region}/sessions: the job credentials of an attempt this claim holds, again
    (before they expire, or after the agent restarted)."""


class AcceptRequest(AttemptRequest):
    """POST /regions/{region}/accepts: answer the dispatch with this claim, when the claim's own
    answer could not say whether it was taken (the claim route answers it first)."""

    dispatch_token: str = Field(min_length=1, max_length=2048)


class HeartbeatRequest(AttemptRequest):
    """POST /regions/{region}/heartbeats: the attempt this claim holds is alive (the route sends
    the task heartbeat with the run token, which the agent never sees)."""


# SendTaskFailure's `cause` holds at most 32,768 characters and `error` 256 (AWS Step Functions
# API Reference, SendTaskFailure: Request Parameters).
TASK_CAUSE_MAX = 32768
TASK_ERROR_MAX = 256


class OutcomeReport(AttemptRequest):
    """POST /regions/{region}/outcomes: how the attempt this claim holds ended. The route records
    it on the stage record (fenced on the claim) and answers the run token with it."""

    # manual_review: reconciliation found an effect it cannot tie to this operation (a failure
    # of class Relevo.Reconcile.ManualReview: the stage then waits for an operator).
    status: Literal["succeeded", "warning", "failed", "manual_review"]
    # What is known of the command's effect (relevo_core.store.stage_attempts.AttemptOutcome).
    outcome: Literal["succeeded", "failed", "unknown", "manual_review", "resolved"]
    exit_code: int | None = None
    error: str | None = Field(default=None, max_length=TASK_ERROR_MAX)
    cause: str | None = Field(default=None, max_length=TASK_CAUSE_MAX)
    receipt: dict[str, Any] | None = None
    # The command's process group is gone: the lease ends now, not at its deadline.
    lease_ended: bool = True
    # The attempt's tests as its reports said them (relevo_core.models.test_results), kept on the
    # stage's (or shard's) record with the outcome, fenced alike.
    tests: ResultsSummary | None = None


class PlanRequest(AttemptRequest):
    """POST /regions/{region}/plans: the test plan of the sharded stage this claim holds a shard
    of (relevo_core.fleet.test_plans). The listing the shard made is stored first, with the job's
    session, at the key its sha256 gives (relevo_core.models.job_objects.test_listing_key): a
    listing of 100,000 ids is megabytes, past what a request to API Gateway and Lambda may carry
    (a synchronous invocation's payload is 6 MB: AWS Lambda Developer Guide, "Lambda quotas")."""

    listing_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class PlanGranted(BaseModel):
    """The stage's plan, as the first shard to ask made it: stored at `plan_key` under the job's
    prefix (JSON of relevo_core.models.test_results.TestPlan, `plan_sha256` as stored), read by
    the agent with its job session; the answer stays small whatever the plan's size."""

    model_config = ConfigDict(frozen=True)

    plan_key: str
    plan_sha256: str
    listing_sha256: str
    by: Literal["time", "count"]
    # This shard's tests and their expected seconds together.
    tests: int
    expected_sec: float
    made_now: bool = Field(description="this request made the plan (else it was on record)")


class TaskAnswered(BaseModel):
    """What the accept, heartbeat and outcome routes say: the task took the answer."""

    model_config = ConfigDict(frozen=True)

    answered: bool = True


class JobSession(BaseModel):
    """A session of the stack's JobRole tagged with one job (STS AssumeRole's Credentials)."""

    model_config = ConfigDict(frozen=True)

    access_key_id: str
    secret_access_key: str
    session_token: str
    expiration: datetime


class ClaimGranted(BaseModel):
    """The claim took: the job as it stands, what the attempt before left, and the job's session."""

    model_config = ConfigDict(frozen=True)

    envelope: dict[str, Any]
    # The job's stage records (what the earlier stages left), as the table holds them.
    records: list[dict[str, Any]]
    # What the previous attempt left on the stage record before the claim (reconciliation).
    previous: dict[str, Any]
    session: JobSession
    # The dispatch's answer (ClaimRequest.accept): True, it took this claim; False, it no longer
    # waited (answered, timed out, the job ended); None, not known (not asked, or no answer came:
    # the agent asks again, or watches for its run token).
    accepted: bool | None = None
    # The job's build number (RELEVO_BUILD_NUMBER), given by the first claim of a stage that needs
    # one (relevo_core.fleet.build_numbers); None while the job has none.
    build_number: int | None = None


class SessionGranted(BaseModel):
    model_config = ConfigDict(frozen=True)

    session: JobSession
