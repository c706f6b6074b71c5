"""An agent's claim of a stage attempt its region's queue handed it (POST /regions/{region}/claims),
and the renewal of the job credentials that come with it (POST /regions/{region}/sessions).

Who may: any agent of the region (the route's IAM grant is the region's agent role, and the route
is the region's), for an attempt that was dispatched to that region and whose dispatch key it
shows: the key is drawn by the state machine for each dispatch and carried only by its stage
message, so an agent claims only what its queue handed it. What it gets: the claim (the fenced
conditional write of store/stage_attempts), the job as it stands, and a session of JobRole tagged
with that job (fleet/job_credentials): from then on the agent does nothing for the job with its
own credentials. The route also answers the dispatch with the claim (the agent's command starts
once the state machine took it: one round trip fewer on the way to it). A renewal is given to the
claim that still holds the attempt, proved by the claim secret only that agent knows.
"""

from __future__ import annotations

from concurrent.futures import wait
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from relevo_core.aws import error_code, in_this_context, ready_clients, side_by_side
from relevo_core.config.agent_sessions import AgentSessionsSettings
from relevo_core.execution import TaskGone, fail_task, succeed_task
from relevo_core.fleet import job_credentials
from relevo_core.jobs.handoff_sources import MAX_LINEAGE, context_of
from relevo_core.models.agent_session import ClaimGranted, ClaimRequest, JobSession, SessionGranted, SessionRequest, claim_id_of
from relevo_core.models.envelope import JobEnvelope
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.status import SUCCEEDED_STAGE, JobStatus, StageStatus
from relevo_core.observability import logger
from relevo_core.store import stage_attempts
from relevo_core.store.jobs import get_envelope, get_job_record, query_job_items
from relevo_core.store.keys import SHARD_INFIX, attempt_sk, is_stage_sk, stage_sk

# What a refused claim tells its caller of the stage record: enough to know whether to hand the
# message back or drop it (relevo_agent's ClaimRefused.held), nothing of what the stage left.
_REFUSAL_FIELDS = ("status", "attempt", "agent_id", "lease_expires_at")
_LIVE = {StageStatus.RUNNING.value, StageStatus.RECONCILED.value}


def ready() -> None:
    """At the claim function's init: the clients every claim uses (its reads and claim, the job's
    session, the answer to the dispatch), so that an environment's first claim builds none."""
    ready_clients("dynamodb", "sts", "stepfunctions")


def _known_region(settings: AgentSessionsSettings, region: str) -> None:
    if region not in settings.regions:
        raise RelevoError(ErrorCode.REGION_UNKNOWN, f"region affinity {region!r} is not one of this stack's {list(settings.regions)}")


def _not_dispatched_here(request: ClaimRequest | SessionRequest, region: str) -> RelevoError:
    return RelevoError(
        ErrorCode.DISPATCH_NOT_FOUND,
        f"{request.job_id} stage {request.stage_index} attempt {request.attempt} was not dispatched to region {region!r} under this key",
    )


def lineage_of(table: str, envelope: JobEnvelope) -> list[str]:
    """The jobs whose stages a job started from a later stage stands on (retry_of, and theirs
    while they skipped stages too), nearest first: what its agents may read for the handoff."""
    found: list[str] = []
    current = envelope
    while current.first_stage_index > 0 and current.retry_of and len(found) < MAX_LINEAGE:
        found.append(current.retry_of)
        try:
            current = get_envelope(table, current.retry_of)
        except RelevoError:
            break  # deleted: nothing of it is read
    return found


def _fail_dispatch(token: str, error: RelevoError) -> None:
    """A job that is gone or unreadable ends its dispatch for good (the agent has no task power)."""
    try:
        fail_task(token, error.code.value, error.message)
    except TaskGone:
        pass
    except ClientError as exc:
        logger.warning("the dispatch of an unreadable job could not be failed", extra={"error": error_code(exc)})


def claim_stage(settings: AgentSessionsSettings, region: str, request: ClaimRequest, now: datetime) -> ClaimGranted:
    _known_region(settings, region)
    table = settings.table_name
    items = query_job_items(table, request.job_id)
    try:
        if not items:
            raise RelevoError(ErrorCode.JOB_NOT_FOUND, f"no job {request.job_id!r}")
        context = context_of(items)
    except RelevoError as exc:
        _fail_dispatch(request.dispatch_token, exc)
        raise
    envelope = context.envelope
    index = request.stage_index
    # The attempt's own record: the stage's, or for a stage with shards, the shard's.
    own_sk = attempt_sk(index, request.shard)
    record = next((item for item in items if item["sk"] == own_sk and str(item["pk"]).startswith("STAGES#")), None)
    if envelope.region_affinity != region or record is None or record.get("dispatch_key") != request.dispatch_key:
        raise _not_dispatched_here(request, region)
    if (request.project is not None and request.project != envelope.project) or (
        request.signs is not None and request.signs != (envelope.signing is not None)
    ):
        # A copy of the message passed on by another agent of the region, changed on the way:
        # the agent's decisions before its claim rested on it.
        raise RelevoError(ErrorCode.DISPATCH_NOT_FOUND, f"the stage message of {request.job_id} does not say what its job is (project, signing)")
    if request.leave_to_previous and request.attempt == 1:
        before = context.stage_before(index)
        previous_agent = before.get("agent_id") if before and before.get("status") in SUCCEEDED_STAGE else None
        if previous_agent and previous_agent != request.agent_id:
            raise RelevoError(
                ErrorCode.PREVIOUS_AGENT_PREFERRED, f"the stage before ran on {previous_agent}", agent_id=str(previous_agent)
            )
    ref = stage_attempts.StageRef(table, request.job_id, index, request.attempt, request.agent_id, shard=request.shard)
    # This very claim made before (its answer lost on the way back): a dispatch that no longer
    # waits may have been answered by that first request, so its answer is not known.
    repeat = record.get("claim_id") == claim_id_of(request.claim_secret)

    def claim() -> dict[str, Any]:
        return stage_attempts.claim(
            ref, envelope.lease_ttl_sec, now, request.precondition_version, request.enqueued_at,
            claim_id_of(request.claim_secret), request.journal_id, dispatch_key=request.dispatch_key, previous=record,
        )

    def mint() -> JobSession:
        return job_credentials.mint(settings.job_role_arn, envelope, index, request.attempt, lineage_of(table, envelope), request.shard)

    # The job's session once the claim holds, beside the answer to the dispatch: as many calls in
    # a row as beside the claim, and a refused claim (a message delivered twice, a lease still
    # held) costs no AssumeRole, which STS rate-limits per account.
    try:
        previous = claim()
    except stage_attempts.ClaimRefused as refused:
        found = {name: refused.item[name] for name in _REFUSAL_FIELDS if name in refused.item}
        raise RelevoError(ErrorCode.CLAIM_REFUSED, f"{request.job_id} stage {index} attempt {request.attempt} is not free", **found) from None
    minted = side_by_side().submit(in_this_context(mint))
    try:
        accepted = _accept(request, repeat) if request.accept else None
    except BaseException:
        wait([minted])  # the mint ends before the request does: nothing of it runs on after its answer
        raise
    session = minted.result()
    # The other stages' records and their shards' (what their handoffs and values left); of its
    # own stage, neither its own record nor a sibling shard's: a shard stands on earlier stages only.
    siblings = f"{stage_sk(index)}{SHARD_INFIX}"
    records = [
        item for item in items
        if str(item["pk"]).startswith("STAGES#") and item["sk"] != own_sk and (is_stage_sk(item["sk"]) or not item["sk"].startswith(siblings))
    ]
    return ClaimGranted(envelope=envelope.to_json_dict(), records=records, previous=previous, session=session, accepted=accepted)


def _accept(request: ClaimRequest, repeat: bool) -> bool | None:
    """Answer the dispatch with the claim just made: the state machine then hands this claim its
    run token (AwaitResult, only while the claim holds). None when it cannot be told."""
    try:
        succeed_task(request.dispatch_token, {"agent_id": request.agent_id, "attempt": request.attempt})
    except TaskGone:
        return None if repeat else False
    except (ClientError, BotoCoreError) as exc:
        logger.warning("the dispatch was not answered; the agent answers it", extra={"error": str(exc)})
        return None
    return True


def renew_session(settings: AgentSessionsSettings, region: str, request: SessionRequest) -> SessionGranted:
    """The job credentials again, for the claim that holds the attempt (its agent, attempt and
    claim secret), while the job has not ended: before a session runs out, or after a restart (the
    report of an attempt the agent ran)."""
    _known_region(settings, region)
    table = settings.table_name
    pool = side_by_side()
    job = pool.submit(in_this_context(get_job_record), table, request.job_id)
    held = pool.submit(in_this_context(stage_attempts.claim_on_record), table, request.job_id, request.stage_index, request.shard)
    wait([job, held])
    record, on_record = job.result(), held.result()
    envelope = context_of([record]).envelope
    if envelope.region_affinity != region:
        raise _not_dispatched_here(request, region)
    mine = (on_record.agent_id, on_record.attempt, on_record.claim_id) == (request.agent_id, request.attempt, claim_id_of(request.claim_secret))
    if not mine:
        raise RelevoError(
            ErrorCode.ATTEMPT_NOT_HELD, f"{request.job_id} stage {request.stage_index} attempt {request.attempt} is not held by this claim"
        )
    if JobStatus(record["status"]).terminal and on_record.status not in _LIVE:
        raise RelevoError(ErrorCode.JOB_ALREADY_ENDED, f"{request.job_id} has ended")
    session = job_credentials.mint(
        settings.job_role_arn, envelope, request.stage_index, request.attempt, lineage_of(table, envelope), request.shard,
    )
    return SessionGranted(session=session)

