"""A job as operators see it (GET /jobs/{id}, `relevo job view`): its records, plus why a stage that
was dispatched is still waiting for an agent, derived from the region's agent presence, its
artifacts and the tail of its log."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from relevo_core.jobs.artifacts import artifact_summary
from relevo_core.jobs.handoff_sources import JobContext
from relevo_core.jobs.logs import log_places, log_tail
from relevo_core.jobs.project_wait import project_wait, waits_for_project
from relevo_core.jobs.stage_records import (
    caches_of,
    current_attempt,
    handoff_of,
    last_successful,
    outputs_of,
    tests_of,
    transfers_of,
    warning_of,
)
from relevo_core.models.capabilities import describe, unmet
from relevo_core.models.effect_summary import effect_summary
from relevo_core.models.envelope import read_envelope
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.job_view import JobView
from relevo_core.models.plan import StagePlan
from relevo_core.models.status import JobStatus, QueueReason, StageStatus
from relevo_core.store import test_plans
from relevo_core.store.agent_pauses import AgentPause, region_pauses
from relevo_core.store.agents import AgentPresence, agents_in_region
from relevo_core.store.artifacts import list_artifacts
from relevo_core.store.codec import envelope_of
from relevo_core.store.jobs import query_job_items
from relevo_core.store.keys import (
    BUILD_NUMBER_ATTRIBUTE,
    HELD_REASON_ATTRIBUTE,
    JOB_SK,
    TEST_PLAN_SK_PREFIX,
    is_stage_sk,
    shard_of_sk,
    test_plan_sk,
)
from relevo_core.store.locks import approval_gate


def _shards_of(
    plan: StagePlan, records: dict[int, dict[str, Any]], never: StageStatus
) -> list[dict[str, Any]]:
    """Each shard of a stage with shards, in shard order, from its own record (keys.shard_sk): a
    shard not dispatched yet (max_parallel, or its stage not reached) has none and is `never`."""
    shards = []
    for shard in plan.shards():
        found = current_attempt(records.get(shard.index, {}))
        shards.append(
            {
                "shard": shard.index,
                "label": shard.label,
                "matrix": shard.matrix,
                "status": found.get("status", never.value),
                "attempt": found.get("attempt"),
                "dispatched_attempt": found.get("dispatched_attempt"),
                "agent_id": found.get("agent_id"),
                "exit_code": found.get("exit_code"),
                "error_class": found.get("error_class"),
                "retry_count": found.get("retry_count", 0),
                "attempts_log": found.get("attempts_log", []),
                "dispatched_at": found.get("dispatched_at"),
                "started_at": found.get("started_at"),
                "ended_at": found.get("ended_at"),
                "last_writer": found.get("last_writer"),
                # The latest reconciliation of the shard (as a stage's `reconciled`).
                "reconciled": found.get("reconciled"),
                # What the shard hands on (its own record's receipt, docs/handoff.md "Stages with shards").
                "outputs": outputs_of(found),
                "handoff": handoff_of(found),
                "caches": caches_of(found),
                "tests": tests_of(found),
            }
        )
    return shards


def _sharded_failure(record: dict[str, Any], shards: list[dict[str, Any]]) -> dict[str, Any]:
    """A stage with shards: its failed shards, in shard order, and the class it failed with. Its
    own record keeps the state machine's `last_error` (the failed shard's class with fail_fast,
    the first failed shard's without: job.asl.json MarkShardedStageFailed), never an agent's
    `error_class`: its shards' agents report on the shards' records."""
    failed = [shard for shard in shards if shard["status"] == StageStatus.FAILED.value]
    error = (
        record.get("error_class")
        or record.get("last_error")
        or next((s["error_class"] for s in failed if s["error_class"]), None)
    )
    return {"failed_shards": [shard["shard"] for shard in failed], "error_class": error or None}


def job_items_to_view(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge a job's record and stage records into one read model, stages in plan order."""
    record = next((item for item in items if item["sk"] == JOB_SK), None)
    if record is None:
        raise RelevoError(ErrorCode.JOB_NOT_FOUND, "no such job")
    envelope = read_envelope(envelope_of(record))
    stage_records = {item.get("stage_name"): item for item in items if is_stage_sk(item["sk"])}
    plans = {item["sk"]: item for item in items if str(item["sk"]).startswith(TEST_PLAN_SK_PREFIX)}
    # Each stage's shards' records (STAGE#nn#SHARD#kk), by stage index then shard index.
    shard_records: dict[int, dict[int, dict[str, Any]]] = {}
    for item in items:
        place = shard_of_sk(str(item["sk"]))
        if place is not None:
            shard_records.setdefault(place[0], {})[place[1]] = item
    try:
        commit = JobContext.of(envelope, items).commit()
    except RelevoError:  # COMMITS_DIFFER: the shards did not agree; the failed stage says so
        commit = None
    # A stage never dispatched before its job ended will never run: it is skipped, not pending.
    never = StageStatus.SKIPPED if JobStatus(record["status"]).terminal else StageStatus.PENDING
    stages = []
    for index, stage in enumerate(envelope.stages):
        found = current_attempt(stage_records.get(stage.name, {}))
        skipped = index < envelope.first_stage_index
        # A stage with shards: each shard's own attempt (the stage's record says how the stage
        # as a whole went). Empty for a stage without.
        shards = (
            []
            if not stage.sharded
            else _shards_of(
                stage,
                shard_records.get(index, {}),
                StageStatus.SKIPPED if skipped else never,
            )
        )
        stages.append(
            {
                "index": index,
                "name": stage.name,
                "requires": stage.requires,
                # Stages before from_stage are not run again: their results are the earlier job's.
                "status": StageStatus.SKIPPED.value if skipped else found.get("status", never.value),
                "reused_from": envelope.retry_of if skipped else None,
                "retry_count": found.get("retry_count", 0),
                "cumulative_backoff_sec": found.get("cumulative_backoff_sec", 0),
                "attempts_log": found.get("attempts_log", []),
                "attempt": found.get("attempt"),
                "dispatched_attempt": found.get("dispatched_attempt"),
                "agent_id": found.get("agent_id"),
                "exit_code": found.get("exit_code"),
                "error_class": found.get("error_class"),
                "dispatched_at": found.get("dispatched_at"),
                # When the region's queue took the claimed attempt's message (SQS SentTimestamp).
                "enqueued_at": found.get("enqueued_at"),
                "started_at": found.get("started_at"),
                "ended_at": found.get("ended_at"),
                "last_writer": found.get("last_writer"),
                # Reconcile before retry: what is known of the effect, the latest decision with
                # its evidence, and an operator's resolution of a manual review.
                "outcome": found.get("outcome"),
                "reconciled": found.get("reconciled"),
                # Every reconciliation of the stage, oldest first (reconciled is the latest).
                "reconciliations": found.get("reconciliations", []),
                "resolution": found.get("resolution"),
                # Each attempt's artifact upload (files and bytes done of the total), oldest
                # attempt first, and the one of the attempt shown (live while it uploads).
                **transfers_of(found),
                # What travels to the later stages (docs/handoff.md): its values and its files.
                "outputs": outputs_of(found),
                "handoff": handoff_of(found),
                "caches": caches_of(found),
                # Its tests as its last attempt's reports said them (docs/test-results.md).
                "tests": tests_of(found),
                # A built-in release effect: its kind, identifiers and Apple's state, from its values.
                "effect": effect_summary(
                    stage.effect.kind if stage.effect else None,
                    outputs_of(found),
                    found.get("status"),
                    found.get("reconciled"),
                    envelope.retry_of if skipped else None,
                ),
                # A `warning` stage: what made it one, in a sentence (its receipt's warnings.text).
                "warning": warning_of(found),
                "shards": shards,
                # A sharded stage's test plan (relevo_core.fleet.test_plans), once made.
                "test_plan": test_plans.shown(plans.get(test_plan_sk(index))),
                # A stage with shards: the shards that failed, and the class it failed with.
                **(_sharded_failure(found, shards) if stage.sharded else {"failed_shards": []}),
            }
        )
    current = next(
        (
            s["name"]
            for s in stages
            if s["status"] in ("dispatched", "running", "reconciled", "manual_review")
        ),
        None,
    )
    return {
        "job_id": envelope.job_id,
        "project": envelope.project,
        "status": record["status"],
        "trigger": envelope.trigger.model_dump(mode="json"),
        "ref": envelope.ref,
        # The trigger's commit, or the one the job's first checkout resolved its ref to (on its
        # shards' records when that stage has shards).
        "commit": commit,
        "commit_source": "trigger" if envelope.commit else ("checkout" if commit else None),
        "region_affinity": envelope.region_affinity,
        "priority": record.get("priority", envelope.priority),
        "queue_seq": record.get("queue_seq"),
        "created_at": record.get("created_at"),
        "updated_at": record.get("updated_at"),
        "ended_at": record.get("ended_at"),
        "current_stage": current,
        "queue_reason": record.get("queue_reason"),
        "held_reason": record.get(HELD_REASON_ATTRIBUTE),
        # The stage an approval gate holds back, while the job waits there.
        "waiting_stage": record.get("waiting_stage") if record["status"] == JobStatus.WAITING.value else None,
        # Who answered the gate (approved / rejected), when and why.
        "approval_decision": record.get("approval_decision"),
        "from_stage": envelope.from_stage,
        "retry_of": envelope.retry_of,
        "build_number": record.get(BUILD_NUMBER_ATTRIBUTE),
        # Recorded by the state machine when the job ends; while it runs, read off its stages:
        # the last of them that succeeded in plan order (or what a rerun stands on).
        "last_successful_stage": last_successful(record, stages),
        "last_writer": record.get("last_writer"),
        "error": record.get("error_name"),
        "error_cause": record.get("error_cause"),
        # The stages that ended `warning` (the job went on: it may still succeed).
        "warning_stages": [stage["name"] for stage in stages if stage["status"] == StageStatus.WARNING.value],
        "stages": stages,
        "artifact_max_job_bytes": envelope.artifact_max_job_bytes,
    }


def agent_queue_reason(
    agents: Iterable[AgentPresence],
    now: datetime,
    pauses: Mapping[str | None, AgentPause] | None = None,
    requires: Mapping[str, str] | None = None,
) -> QueueReason | None:
    """Why a dispatched stage is unclaimed: no agent of its region online (`agent_offline`); none
    online meets the stage's `requires` (`no_matching_agent`); the region's dispatch paused, or
    every matching online agent paused (`agent_paused`, from the pauses the operators set, or the
    reason an agent's presence gives); every one that claims at capacity (`agent_busy`). None when
    an online agent has a free slot: the stage is about to be claimed."""
    pauses = pauses or {}
    online = [agent for agent in agents if agent.is_online(now)]
    if not online:
        return QueueReason.AGENT_OFFLINE
    if requires:
        online = [agent for agent in online if not unmet(dict(requires), agent.capabilities)]
        if not online:
            return QueueReason.NO_MATCHING_AGENT
    dispatch = pauses.get(None)
    if dispatch is not None and dispatch.active(now):
        return QueueReason.AGENT_PAUSED

    def why_not(agent: AgentPresence) -> str | None:
        pause = pauses.get(agent.agent_id)
        if pause is not None and pause.active(now):
            return QueueReason.AGENT_PAUSED.value
        return agent.not_claiming

    claiming = [agent for agent in online if why_not(agent) is None]
    if not claiming:
        reasons = [why_not(agent) for agent in online]
        return QueueReason(
            QueueReason.AGENT_PAUSED.value if QueueReason.AGENT_PAUSED.value in reasons else reasons[0]
        )
    if all(agent.free == 0 for agent in claiming):
        return QueueReason.AGENT_BUSY
    return None


NEAREST_AGENTS = 3


def no_match_detail(requires: Mapping[str, str], agents: Iterable[AgentPresence], now: datetime) -> str:
    """`no_matching_agent`'s message: the requirement, and the online agents that come nearest
    (fewest unmet keys) with what they have instead."""
    rows = []
    for agent in agents:
        if agent.is_online(now):
            missing = unmet(dict(requires), agent.capabilities)
            rows.append(
                (
                    len(missing),
                    agent.agent_id,
                    ", ".join(f"{key} {value or 'none'}" for key, value in missing.items()),
                )
            )
    nearest = "; ".join(f"{agent_id} has {has}" for _, agent_id, has in sorted(rows)[:NEAREST_AGENTS])
    return f"no online agent meets requires {{{describe(dict(requires))}}}" + (
        f"; nearest: {nearest}" if nearest else ""
    )


def unclaimed_shards(items: Iterable[Mapping[str, Any]], view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The shards of a job's stages that are dispatched and not claimed yet, in plan order:
    `{stage, shard, attempt, requires, dispatched_at}` (a shard's record is beside its stage's:
    keys.shard_sk)."""
    waiting = []
    for item in items:
        sk = str(item["sk"])
        if (
            not sk.startswith("STAGE#")
            or is_stage_sk(sk)
            or item.get("status") != StageStatus.DISPATCHED.value
        ):
            continue
        stage = view["stages"][int(sk.split("#")[1])]
        waiting.append(
            {
                "stage": stage["name"],
                "shard": int(item.get("shard_index", sk.rsplit("#", 1)[1])),
                "attempt": item.get("dispatched_attempt", item.get("attempt")),
                "requires": stage["requires"],
                "dispatched_at": item.get("dispatched_at"),
            }
        )
    return sorted(waiting, key=lambda shard: (str(shard["stage"]), int(shard["shard"])))


def waiting_reason(
    table: str,
    view: Mapping[str, Any],
    now: datetime,
    items: Iterable[Mapping[str, Any]] = (),
) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    """(queue_reason, queue_detail, waiting_shards) of a job view (see queue_wait)."""
    reason, detail, shards, _behind = queue_wait(table, view, now, items)
    return reason, detail, shards


def queue_wait(
    table: str,
    view: Mapping[str, Any],
    now: datetime,
    items: Iterable[Mapping[str, Any]] = (),
) -> tuple[str | None, str | None, list[dict[str, Any]], dict[str, Any] | None]:
    """(queue_reason, queue_detail, waiting_shards, waiting_behind) of a job view. A job queued
    for its project (the state machine recorded project_running) says project_running while a
    job of the project runs, and project_waiting_for_approval, naming that job, its stage and
    since when (`waiting_behind`), while the job holding the project's lock waits at its
    approval gate (the lock says so: relevo_core.jobs.project_wait). While a stage of a live
    job, or shards of one (from the job's `items`), are dispatched and unclaimed, why no agent
    took them (agent_offline, agent_busy, …), from the region's presence and pauses.
    `waiting_shards` says it of each shard: `{stage, shard, attempt, queue_reason, queue_detail}`."""
    if waits_for_project(view):
        reason, detail, behind = project_wait(view["queue_reason"], approval_gate(table, view["project"]))
        return reason, detail, [], behind
    reason, detail, shards = _agent_wait(table, view, now, items)
    return reason, detail, shards, None


def _agent_wait(
    table: str,
    view: Mapping[str, Any],
    now: datetime,
    items: Iterable[Mapping[str, Any]] = (),
) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    unclaimed = [stage for stage in view["stages"] if stage["status"] == StageStatus.DISPATCHED.value][:1]
    shards = unclaimed_shards(items, view)
    if view["queue_reason"] is not None or not (unclaimed or shards) or JobStatus(view["status"]).terminal:
        return view["queue_reason"], None, []
    region = view["region_affinity"]
    region_agents = agents_in_region(table, region)
    pauses = region_pauses(table, region)

    def why(requires: Mapping[str, str]) -> tuple[str | None, str | None]:
        reason = agent_queue_reason(region_agents, now, pauses, requires)
        detail = (
            no_match_detail(requires, region_agents, now) if reason is QueueReason.NO_MATCHING_AGENT else None
        )
        return (reason.value if reason else None), detail

    waiting_shards = [
        {
            **{name: shard[name] for name in ("stage", "shard", "attempt")},
            **dict(zip(("queue_reason", "queue_detail"), why(shard["requires"]), strict=True)),
        }
        for shard in shards
    ]
    if unclaimed:
        return (*why(unclaimed[0]["requires"]), waiting_shards)
    first = waiting_shards[0]
    return first["queue_reason"], first["queue_detail"], waiting_shards


def show_job(table: str, job_id: str, now: datetime) -> dict[str, Any]:
    """The job view; `queue_reason` also says agent_busy / agent_offline while a stage of a live
    job, or a shard of one, is dispatched and unclaimed (a reason the state machine recorded,
    project_running, stays); `waiting_shards` says it of each shard that waits."""
    items = query_job_items(table, job_id)
    view = job_items_to_view(items)
    view["queue_reason"], view["queue_detail"], view["waiting_shards"], view["waiting_behind"] = queue_wait(
        table, view, now, items
    )
    records = list_artifacts(table, job_id)
    view["artifacts"] = [artifact_summary(record) for record in records if record.kind != "handoff"]
    # The job's artifact total beside its project's bound (artifact.max_job_bytes), when it has one:
    # its handoffs' objects count too. Removed artifacts (artifact.max_total_bytes) are listed
    # with removed_at but no longer count.
    view["artifact_bytes"] = sum(record.size for record in records if record.removed_at is None)
    view["handoff_bytes"] = sum(
        record.size for record in records if record.kind == "handoff" and record.removed_at is None
    )
    # The last lines of the output, read back from the end of the log (never the whole log).
    parts, home = log_places(items)
    view["log_tail"] = log_tail(table, job_id, parts, home=home)
    # The API's answer as its OpenAPI document describes it (relevo_core.models.job_view).
    return JobView.model_validate(view).model_dump(mode="json")
