"""An agent's claim of a stage attempt its region's queue handed it (POST /regions/{region}/claims),
and the renewal of the job credentials that come with it (POST /regions/{region}/sessions).

Who may: any agent of the region (the route's IAM grant is the region's agent role, and the route
is the region's), for an attempt that was dispatched to that region and whose dispatch key it
shows: the key is drawn by the state machine for each dispatch and carried only by its stage
message, so an agent claims only what its queue handed it. What it gets: the claim (the fenced
conditional write of store/stage_claims), the job as it stands, and a session of JobRole tagged
with that job (fleet/job_credentials): from then on the agent does nothing for the job with its
own credentials. The route also answers the dispatch with the claim (the agent's command starts
once the state machine took it: one round trip fewer on the way to it). A renewal is given to the
claim that still holds the attempt, proved by the claim secret only that agent knows.

The attempt's task is answered here too, never by the agent: POST /regions/{region}/accepts (the
dispatch, when the claim's answer could not tell), /heartbeats and /outcomes (the run, with the
run token the state machine keeps in the job's token partition, which no job session can read or
use: the job session holds no states:SendTask* at all). Each checks that the caller holds that
very attempt (agent, attempt and claim secret on the stage record) before it answers.
"""

from __future__ import annotations

from concurrent.futures import Future, wait
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from relevo_core.aws import error_code, in_this_context, ready_clients, side_by_side
from relevo_core.config.agent_sessions import AgentSessionsSettings
from relevo_core.execution import TaskGone, fail_task, heartbeat_task, succeed_task
from relevo_core.fleet import build_numbers, job_credentials, warm_macs
from relevo_core.fleet.stood_on import holds_files, lineage_of
from relevo_core.jobs.handoff_sources import JobContext, context_of
from relevo_core.models.agent_session import (
    AcceptRequest,
    AttemptRequest,
    ClaimGranted,
    ClaimRequest,
    HeartbeatRequest,
    JobSession,
    OutcomeReport,
    SessionGranted,
    SessionRequest,
    TaskAnswered,
    claim_id_of,
)
from relevo_core.models.envelope import JobEnvelope
from relevo_core.models.errors import ErrorClass, ErrorCode, RelevoError
from relevo_core.models.status import SUCCEEDED_STAGE, JobStatus, StageStatus
from relevo_core.observability import logger
from relevo_core.store import stage_attempts, stage_claims, task_tokens
from relevo_core.store.jobs import get_job_record, query_job_items
from relevo_core.store.keys import SHARD_INFIX, attempt_sk, is_stage_sk, stage_sk

# What a refused claim tells its caller of the stage record: enough to know whether to hand the
# message back or drop it (relevo_agent's ClaimRefused.held), and whose claim holds it (the
# journal and the claim secret's hash: an agent whose claim's answer was lost knows it for its
# own; a hash tells nobody the secret), nothing of what the stage left.
_REFUSAL_FIELDS = ("status", "attempt", "agent_id", "lease_expires_at", "journal_id", "claim_id")
_LIVE = {StageStatus.RUNNING.value, StageStatus.RECONCILED.value}


def ready() -> None:
    """At the claim function's init: the clients every claim uses (its reads and claim, the job's
    session, the answer to the dispatch), so that an environment's first claim builds none."""
    ready_clients("dynamodb", "sts", "stepfunctions")


def known_region(settings: AgentSessionsSettings, region: str) -> None:
    if region not in settings.regions:
        raise RelevoError(
            ErrorCode.REGION_UNKNOWN,
            f"region affinity {region!r} is not one of this stack's {list(settings.regions)}",
        )


def _not_dispatched_here(request: ClaimRequest | SessionRequest, region: str) -> RelevoError:
    return RelevoError(
        ErrorCode.DISPATCH_NOT_FOUND,
        f"{request.job_id} stage {request.stage_index} attempt {request.attempt} was not dispatched to "
        f"region {region!r} under this key",
    )


def _fail_dispatch(token: str, error: RelevoError) -> None:
    """A job that is gone or unreadable ends its dispatch for good (the agent has no task power)."""
    try:
        fail_task(token, error.code.value, error.message)
    except TaskGone:
        pass
    except ClientError as exc:
        logger.warning(
            "the dispatch of an unreadable job could not be failed", extra={"error": error_code(exc)}
        )


def _offer_to_warm_macs(table: str, context: JobContext, index: int, agent_id: str) -> None:
    """PREVIOUS_AGENT_PREFERRED when Macs better placed than `agent_id` for the stage are known
    (fleet/warm_macs: the previous stage's Mac where files wait, then its caches' holders), naming
    them best first (`agents`; `agent_id` the first, as an agent from before caches reads it)."""
    before = context.stage_before(index)
    # Only where files wait: the stage before handed some on, or restored some (the next stage
    # restores the same). With none, any Mac is as good for them.
    ran_on = before.get("agent_id") if before else None
    previous_agent = (
        str(ran_on)
        if ran_on and before and before.get("status") in SUCCEEDED_STAGE and holds_files(before)
        else None
    )
    if previous_agent == agent_id:
        return  # its files are here: nothing is read of the caches
    better = warm_macs.ranked(previous_agent, warm_macs.cache_macs(table, context.envelope, index), agent_id)
    if better:
        why = (
            f"the stage before ran on {previous_agent}"
            if better[0] == previous_agent
            else f"{better[0]} recently saved or restored the stage's caches"
        )
        raise RelevoError(ErrorCode.PREVIOUS_AGENT_PREFERRED, why, agent_id=better[0], agents=better)


def claim_stage(
    settings: AgentSessionsSettings, region: str, request: ClaimRequest, now: datetime
) -> ClaimGranted:
    known_region(settings, region)
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
    record = next(
        (item for item in items if item["sk"] == own_sk and str(item["pk"]).startswith("STAGES#")), None
    )
    if (
        envelope.region_affinity != region
        or record is None
        or record.get("dispatch_key") != request.dispatch_key
    ):
        raise _not_dispatched_here(request, region)
    if (request.project is not None and request.project != envelope.project) or (
        request.signs is not None and request.signs != (envelope.signing is not None)
    ):
        # A copy of the message passed on by another agent of the region, changed on the way:
        # the agent's decisions before its claim rested on it.
        raise RelevoError(
            ErrorCode.DISPATCH_NOT_FOUND,
            f"the stage message of {request.job_id} does not say what its job is (project, signing)",
        )
    if request.leave_to_previous and request.attempt == 1:
        _offer_to_warm_macs(table, context, index, request.agent_id)
    ref = stage_attempts.StageRef(
        table, request.job_id, index, request.attempt, request.agent_id, shard=request.shard
    )
    # This very claim made before (its answer lost on the way back): a dispatch that no longer
    # waits may have been answered by that first request, so its answer is not known.
    repeat = record.get("claim_id") == claim_id_of(request.claim_secret)

    def claim() -> dict[str, Any]:
        return stage_claims.claim(
            ref,
            envelope.lease_ttl_sec,
            now,
            request.precondition_version,
            request.enqueued_at,
            claim_id_of(request.claim_secret),
            request.journal_id,
            dispatch_key=request.dispatch_key,
            previous=record,
        )

    def mint() -> JobSession:
        return job_credentials.mint(
            settings.job_role_arn,
            envelope,
            index,
            request.attempt,
            lineage_of(table, envelope),
            request.shard,
        )

    # The job's session once the claim holds, beside the answer to the dispatch: as many calls in
    # a row as beside the claim, and a refused claim (a message delivered twice, a lease still
    # held) costs no AssumeRole, which STS rate-limits per account.
    try:
        previous = claim()
    except stage_claims.ClaimRefused as refused:
        found = {name: refused.item[name] for name in _REFUSAL_FIELDS if name in refused.item}
        raise RelevoError(
            ErrorCode.CLAIM_REFUSED,
            f"{request.job_id} stage {index} attempt {request.attempt} is not free",
            **found,
        ) from None
    minted = side_by_side().submit(in_this_context(mint))
    # The job's build number: from its record, or given now beside the mint (fleet/build_numbers).
    give = build_numbers.to_give(table, envelope, index, items)
    numbered = [side_by_side().submit(in_this_context(give))] if give else []
    try:
        accepted = _accept(request, repeat) if request.accept else None
    except BaseException:
        running: list[Future[Any]] = [minted, *numbered]
        wait(running)  # they end before the request does: nothing runs on after its answer
        raise
    session = minted.result()
    build_number = numbered[0].result() if numbered else build_numbers.on_record(items)
    # The other stages' records and their shards' (what their handoffs and values left); of its
    # own stage, neither its own record nor a sibling shard's: a shard stands on earlier stages only.
    siblings = f"{stage_sk(index)}{SHARD_INFIX}"
    records = [
        item
        for item in items
        if str(item["pk"]).startswith("STAGES#")
        and item["sk"] != own_sk
        and (is_stage_sk(item["sk"]) or not item["sk"].startswith(siblings))
    ]
    return ClaimGranted(
        envelope=envelope.to_json_dict(),
        records=records,
        previous=previous,
        session=session,
        accepted=accepted,
        build_number=build_number,
    )


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


def _refuse_unless_mine(request: AttemptRequest, on_record: stage_claims.ClaimOnRecord) -> None:
    """The record names this agent, attempt and claim (the claim secret's hash): else 409
    ATTEMPT_NOT_HELD. Only the agent that made the claim knows its secret."""
    mine = (on_record.agent_id, on_record.attempt, on_record.claim_id) == (
        request.agent_id,
        request.attempt,
        claim_id_of(request.claim_secret),
    )
    if not mine:
        raise RelevoError(
            ErrorCode.ATTEMPT_NOT_HELD,
            f"{request.job_id} stage {request.stage_index} attempt {request.attempt} is not held by this "
            "claim",
        )


def refuse_unless_holding(
    request: AttemptRequest, on_record: stage_claims.ClaimOnRecord, now: datetime
) -> None:
    """This claim's attempt holds its lease now: live (not ended) and not past its lease's end
    (an agent fences its own command before that end), else 409 ATTEMPT_ENDED."""
    _refuse_unless_mine(request, on_record)
    named = f"{request.job_id} stage {request.stage_index} attempt {request.attempt}"
    if not on_record.live:
        raise RelevoError(
            ErrorCode.ATTEMPT_ENDED, f"{named} has ended ({on_record.status})", status=on_record.status
        )
    if on_record.lease_expires_at <= int(now.timestamp()):
        raise RelevoError(
            ErrorCode.ATTEMPT_ENDED,
            f"{named} no longer holds its lease (it ran out: fenced)",
            status=on_record.status,
        )


def renew_session(
    settings: AgentSessionsSettings, region: str, request: SessionRequest, now: datetime
) -> SessionGranted:
    """The job credentials again, for the claim whose attempt holds its lease now (its agent,
    attempt and claim secret): before a session runs out, or after a restart while the lease
    still holds. An attempt that ended, ran out of lease, or whose job went on past it (it waits
    at a later stage's approval gate) gets none: 409 ATTEMPT_ENDED. Its report needs no session
    (POST /regions/{region}/outcomes)."""
    known_region(settings, region)
    table = settings.table_name
    pool = side_by_side()
    job = pool.submit(in_this_context(get_job_record), table, request.job_id)
    held = pool.submit(
        in_this_context(stage_claims.claim_on_record),
        table,
        request.job_id,
        request.stage_index,
        request.shard,
    )
    both: list[Future[Any]] = [job, held]
    wait(both)
    record, on_record = job.result(), held.result()
    envelope = context_of([record]).envelope
    if envelope.region_affinity != region:
        raise _not_dispatched_here(request, region)
    _refuse_unless_mine(request, on_record)
    if JobStatus(record["status"]).terminal:
        raise RelevoError(ErrorCode.JOB_ALREADY_ENDED, f"{request.job_id} has ended")
    refuse_unless_holding(request, on_record, now)
    gate = _waiting_gate_index(record, envelope)
    if gate is not None and gate > request.stage_index:
        raise RelevoError(
            ErrorCode.ATTEMPT_ENDED,
            f"{request.job_id} waits for approval before stage {record.get('waiting_stage')}, past stage "
            f"{request.stage_index}",
            status=on_record.status,
        )
    session = job_credentials.mint(
        settings.job_role_arn,
        envelope,
        request.stage_index,
        request.attempt,
        lineage_of(table, envelope),
        request.shard,
    )
    return SessionGranted(session=session)


def _waiting_gate_index(record: dict[str, Any], envelope: JobEnvelope) -> int | None:
    """The index of the stage the job waits before for approval, when it waits at a gate."""
    if record.get("status") != JobStatus.WAITING.value:
        return None
    names = [stage.name for stage in envelope.stages]
    waiting = record.get("waiting_stage")
    return names.index(waiting) if waiting in names else None


def _record_and_run_token(
    table: str,
    request: AttemptRequest,
) -> tuple[stage_claims.ClaimOnRecord, task_tokens.RunToken | None]:
    """The stage record's claim and the attempt's run token, read side by side."""
    pool = side_by_side()
    held = pool.submit(
        in_this_context(stage_claims.claim_on_record),
        table,
        request.job_id,
        request.stage_index,
        request.shard,
    )
    token = pool.submit(
        in_this_context(task_tokens.run_token), table, request.job_id, request.stage_index, request.shard
    )
    both: list[Future[Any]] = [held, token]
    wait(both)
    return held.result(), token.result()


def _this_attempts_token(request: AttemptRequest, token: task_tokens.RunToken | None) -> str:
    """The run token the state machine handed exactly this claim's attempt, else 409 RUN_NOT_HANDED."""
    if token is None or (token.agent_id, token.attempt) != (request.agent_id, request.attempt):
        raise RelevoError(
            ErrorCode.RUN_NOT_HANDED,
            f"{request.job_id} stage {request.stage_index} attempt {request.attempt} was not handed a run "
            "token: the state machine "
            "did not take this claim, and its timeouts decide the attempt",
        )
    return token.token


def _task_gone(request: AttemptRequest, gone: TaskGone) -> RelevoError:
    return RelevoError(
        ErrorCode.TASK_GONE,
        f"the execution no longer waits for {request.job_id} stage {request.stage_index} attempt "
        f"{request.attempt} ({gone})",
    )


def accept_dispatch(
    settings: AgentSessionsSettings, region: str, request: AcceptRequest, now: datetime
) -> TaskAnswered:
    """Answer the dispatch with this claim, when the claim's own answer could not say whether it
    was taken: only for the claim that holds the attempt now (the job session holds no task power)."""
    known_region(settings, region)
    on_record = stage_claims.claim_on_record(
        settings.table_name, request.job_id, request.stage_index, request.shard
    )
    refuse_unless_holding(request, on_record, now)
    try:
        succeed_task(request.dispatch_token, {"agent_id": request.agent_id, "attempt": request.attempt})
    except TaskGone as gone:
        raise _task_gone(request, gone) from gone
    return TaskAnswered()


def heartbeat(
    settings: AgentSessionsSettings, region: str, request: HeartbeatRequest, now: datetime
) -> TaskAnswered:
    """The task heartbeat of the attempt this claim holds now, sent with the run token the state
    machine handed it (which the agent never sees)."""
    known_region(settings, region)
    on_record, token = _record_and_run_token(settings.table_name, request)
    refuse_unless_holding(request, on_record, now)
    try:
        heartbeat_task(_this_attempts_token(request, token))
    except TaskGone as gone:
        raise _task_gone(request, gone) from gone
    return TaskAnswered()


def report_outcome(
    settings: AgentSessionsSettings, region: str, request: OutcomeReport, now: datetime
) -> TaskAnswered:
    """How the attempt this claim holds ended: recorded on its stage record (fenced on the claim:
    a repeat of a report whose answer was lost counts as written), then the run token answered
    with it. The answer is built from the fenced record's attempt and the report's status, never
    from what another attempt left. An attempt never handed a run token has no task: 409
    RUN_NOT_HANDED (the state machine's timeouts decide it)."""
    known_region(settings, region)
    table = settings.table_name
    # The run token read beside the outcome's write, which is fenced on the claim itself (this
    # agent, attempt and claim secret's hash, live): one round trip, where reading the claim on
    # record first took two. What the write found when it was refused says why.
    token = side_by_side().submit(
        in_this_context(task_tokens.run_token), table, request.job_id, request.stage_index, request.shard
    )
    status = StageStatus(request.status)
    ref = stage_attempts.StageRef(
        table, request.job_id, request.stage_index, request.attempt, request.agent_id, shard=request.shard
    )
    try:
        record = stage_attempts.finish(
            ref,
            status,
            now,
            request.exit_code,
            request.error,
            receipt=request.receipt,
            outcome=stage_attempts.AttemptOutcome(request.outcome),
            lease_ended=request.lease_ended,
            claim_id=claim_id_of(request.claim_secret),
            tests=request.tests.model_dump(mode="json") if request.tests is not None else None,
        )
    except stage_attempts.LeaseLost as lost:
        wait([token])  # it ends before the request does: nothing runs on after its answer
        found = lost.item
        attempt = found.get("attempt")
        _refuse_unless_mine(
            request,
            stage_claims.ClaimOnRecord(
                found.get("agent_id"),
                attempt if isinstance(attempt, int) else None,
                found.get("claim_id"),
                found.get("status"),
            ),
        )
        raise RelevoError(
            ErrorCode.ATTEMPT_ENDED,
            f"{request.job_id} stage {request.stage_index} attempt {request.attempt} can no longer be "
            "reported: it is "
            f"{found.get('status')} (attempt {found.get('attempt')}, {found.get('agent_id')})",
            status=found.get("status"),
        ) from None
    except BaseException:
        wait([token])
        raise
    stage_name = str(record.get("stage_name", ""))
    run_token = _this_attempts_token(request, token.result())
    try:
        if status.succeeded:
            # The state machine keeps each stage's output (the job record's stage_outcomes): a
            # `warning` stage is said there for the job's commit status.
            succeed_task(
                run_token,
                {
                    "stage": stage_name,
                    "attempt": request.attempt,
                    "agent_id": request.agent_id,
                    "status": status.value,
                },
            )
        else:
            fail_task(run_token, request.error or ErrorClass.COMMAND_FAILED.value, request.cause or "")
    except TaskGone as gone:
        raise _task_gone(request, gone) from gone
    return TaskAnswered()
