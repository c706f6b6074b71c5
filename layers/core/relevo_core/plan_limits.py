"""How large a plan may be: what the job's execution carries must fit Step Functions' payload quota.

Step Functions refuses a state whose input or output is over 256 KiB (262,144 bytes) of UTF-8
JSON: the execution dies with `States.DataLimitExceeded`, which no Catch can take (Step Functions
Developer Guide, "Step Functions service quotas", and "Handling errors": States.DataLimitExceeded
is a terminal error `States.ALL` does not catch). A job's execution carries its frozen envelope,
and the largest state it holds is on the dead-letter path (ReadJobForDeadLetter to JobFailed),
where the envelope is there twice: in the execution input, and in the job record read back for
the dead-letter entry (so that the entry alone can resume the job), where it is packed (zlib, then
base64: store.codec.pack_envelope). Packing shrinks ordinary text, but base64 adds a third to what
zlib cannot shrink (random tokens, say), so the packed form can be the larger one.

Sizes here are counted the way the emulator counts them (`json.dumps` with its default
separators and ASCII escapes), which is never less than the compact UTF-8 JSON AWS counts. The
envelope is measured as the largest of its forms: plain JSON, DynamoDB's attribute-value JSON (what
records written before packing hold) and the packed string.

The worst case on the dead-letter path, for an envelope of MAX_ENVELOPE_BYTES:
    the envelope, plain JSON, in the execution input          ≤  80 KiB
    the envelope, packed, in the job record read back          ≤  80 KiB
    the rest of the execution input: the stages as the state
      machine sees them, ids, queue URL, wait and conflict
      bookkeeping, each stage's previous one (measured: 15.8
      KiB for 32 stages with 63-character names and the
      longest timeouts), and the shards of stages with shards
      (at most 45 stage runs, each shard's index and record key:
      measured 16.4 KiB for 32 stages, one of 14 shards)        ≤  20 KiB
    the failure: Error ≤ 256 characters, and a Cause of at most
      MAX_FAILURE_CAUSE_CHARS inside the stage's failure detail
      (JSON inside a JSON string: a character JSON escapes,
      such as U+0001, takes up to 7 bytes)                     ≤  32 KiB
    waiting and waking: the lock read, the head of the line,
      the head's task token, the job's status and last stage   ≤   4 KiB
    total                                                      ≤ 216 KiB
which leaves 40 KiB (15 % of the quota); a cause of ordinary text leaves over 60 KiB. The
dead-letter message (the envelope in both forms and the cause, ≤ 190 KiB) fits SQS's 256 KiB.

Step Functions takes causes of up to 32,768 characters, and one that long, made of characters
JSON escapes, would not fit beside any envelope (7 bytes each, twice escaped: 224 KiB). The
causes Relevo sends are short: the agent's are small JSON documents (its reconcile evidence keeps
1,024 characters of probe output), and an approval's or a resolution's reason is capped at
2,048 characters, with the actor's ARN beside it: MAX_FAILURE_CAUSE_CHARS covers them.
tests/integration/test_plan_limits.py runs the largest plan these limits allow through success,
a retry and the dead-letter path with such a cause, and shows the emulator's own limit where
this arithmetic puts it.

A stage with shards (`parallel`, `matrix`) adds to the execution input its shard count, its
fail-fast and concurrency settings and each shard's index and record key (under 50 bytes a
shard, at most MAX_SHARD_RUNS of them): inside the 20 KiB line above. What each shard's agent
needs (its matrix values) it reads from the envelope, whose limit already counts the declaration.

A stage with shards that fails without fail_fast fails with a summary, not with its shards'
failures (job.asl.json: SummarizeShardFailures): its failed shards' indexes (at most
MAX_SHARD_RUNS), the first one's class, and where each one's failure is (its own record:
last_error, attempts_log), a few hundred bytes whatever the causes. A failed shard's iteration
ends with its index and class only, so its cause (at most MAX_FAILURE_CAUSE_CHARS: an agent's
longer one is cut, bounded_cause) stays in its own iteration's state. Every shard's failure in
the stage's state and cause, as before, made 45 causes of 4,096 quote-heavy characters a cause
of over 32,768 characters and a state of over 256 KiB: the execution died with
States.DataLimitExceeded, and the dead-letter entry with it. tests/integration/test_parallel_stages.py
runs that fan-out on the emulator and measures every state and cause of its history.

Shards at once. A stage's shards are the iterations of an inline Map (job.asl.json: RunShards),
and an inline Map runs at most 40 iterations at once (Step Functions Developer Guide, "Using Map
state in Inline mode": "In this mode, the Map state supports up to 40 concurrent iterations"):
a MaxConcurrency of 0, or of more than 40, still runs 40 at a time there, and the emulator runs
as many as it is given. A stage that would ask more (over 40 shards without max_parallel, or a
max_parallel over 40 on as many shards) is refused at apply, saying the two ways that fit:
max_parallel of at most 40 (the other shards start as earlier ones end), or the shards split over
stages. A Distributed Map would run more at once (its iterations child executions, each with a
history of its own), which Relevo does not use; the history arithmetic below caps a job at 45
stage runs anyway.

History. Step Functions keeps at most 25,000 events in one execution's history and fails the
execution that needs more (Step Functions Developer Guide, "Step Functions service quotas":
maximum execution history size, 25,000 events, a hard quota). moto does not enforce it
(DESIGN.md), so the budget is arithmetic. Every stage run, and every shard of a stage with
shards, is a run of the per-stage states (tools/relevo_tools/job_machine/stage.py); its worst
case is MAX_ATTEMPTS attempts, each going the long way (dispatch, claim, run, failure, freeze
check, backoff: at most 40 events), then the stage's failure (16 events), its Map iteration
(3) and, for a shard, its stop when a sibling fails (10): EVENTS_PER_STAGE_RUN_WORST = 240
events. Waiting for the project's lock costs at most LOCK_WAIT_EVENTS (measured under 9,000 in
tests/integration/test_waiting_history.py), the job's own states at most JOB_EVENTS. With a
fifth of the quota kept free, MAX_SHARD_RUNS stage runs fit one job:
    (25,000 × 0.8 - 9,000 - 200) / 240 = 45
a plan of 32 stages without shards takes 32 of them.

Pause holds. A dispatch whose queue wait runs out while a pause of its region is in force is
sent again rather than failed, its renewed wait lasting at least PAUSE_HOLD_SEC, and for a shard
that many times the shards that may wait beside it (relevo_core.execution.shard_pause_hold_sec):
one renewal costs at most EVENTS_PER_PAUSE_RENEWAL events (measured in
tests/integration/test_parallel_stages.py). Over a pause of at most PAUSE_MAX_SEC (7 days), the
waits renewed side by side renew together about once an hour, whether one stage waits or 45
shards of one stage do (each every 45 h), plus one first renewal for each stage run whose wait ran
out in it: at most
    PAUSE_MAX_SEC / PAUSE_HOLD_SEC + MAX_SHARD_RUNS = 168 + 45 = 213 renewals, 4,686 events,
inside the fifth of the quota kept free (5,000 events). Were each shard to renew every hour on its
own, 45 waiting shards would need 45 × 169 renewals, about 167,000 events: 6.7 times the quota.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from relevo_core.execution import PAUSE_HOLD_SEC
from relevo_core.models.envelope import JobEnvelope, Trigger, TriggerType, new_job_id
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.project import Project
from relevo_core.models.requests import PAUSE_MAX_SEC
from relevo_core.store.codec import pack_envelope, to_attribute

STATE_PAYLOAD_QUOTA_BYTES = 256 * 1024
MAX_STAGES = 32
MAX_COMMAND_BYTES = 16 * 1024
MAX_PROBE_BYTES = 16 * 1024
MAX_ENVELOPE_BYTES = 80 * 1024
# The longest task-failure cause Relevo's agents and API send (see above); an agent's longer cause
# is cut to it (bounded_cause).
MAX_FAILURE_CAUSE_CHARS = 4096
CAUSE_CUT_MARK = " [cut from {total:,} characters]"
# The history arithmetic (see above).
HISTORY_QUOTA_EVENTS = 25_000
HISTORY_FREE_FRACTION = 0.2
LOCK_WAIT_EVENTS = 9_000
JOB_EVENTS = 200
EVENTS_PER_STAGE_RUN_WORST = 240
MAX_SHARD_RUNS = int(
    (HISTORY_QUOTA_EVENTS * (1 - HISTORY_FREE_FRACTION) - LOCK_WAIT_EVENTS - JOB_EVENTS)
    // EVENTS_PER_STAGE_RUN_WORST
)
# The most iterations of an inline Map that run at once (see above).
MAX_CONCURRENT_SHARDS = 40
# The pause holds' arithmetic (see above): what a pause of PAUSE_MAX_SEC costs a job at most.
# Measured 22 in the emulator: the timed-out dispatch, CheckRegionPauses, HeldByPause,
# RecordPauseHold, WaitLongerWhilePaused, PauseHoldWait and the dispatch sent again.
EVENTS_PER_PAUSE_RENEWAL = 22
PAUSE_HOLD_RENEWALS_WORST = PAUSE_MAX_SEC // PAUSE_HOLD_SEC + MAX_SHARD_RUNS
PAUSE_HOLD_EVENTS_WORST = PAUSE_HOLD_RENEWALS_WORST * EVENTS_PER_PAUSE_RENEWAL


def state_bytes(value: Any) -> int:
    """Bytes of `value` as JSON, counted as the emulator counts a state's data (an upper bound of
    the compact UTF-8 JSON Step Functions counts)."""
    return len(json.dumps(value).encode("utf-8"))


def bounded_cause(cause: str) -> str:
    """`cause` as a failure may carry it: at most MAX_FAILURE_CAUSE_CHARS characters, its head kept
    and the cut said, so that whatever an agent reports stays inside the arithmetic above."""
    if len(cause) <= MAX_FAILURE_CAUSE_CHARS:
        return cause
    mark = CAUSE_CUT_MARK.format(total=len(cause))
    return cause[: MAX_FAILURE_CAUSE_CHARS - len(mark)] + mark


def envelope_bytes(envelope: JobEnvelope) -> int:
    """The envelope's size in the state machine: the largest of its DynamoDB JSON form (plain JSON is
    never larger) and its packed form as the job record read back carries it."""
    data = envelope.to_json_dict()
    return max(state_bytes(to_attribute(data)), state_bytes({"S": pack_envelope(data)}))


def _too_large(message: str, limit: str, size: int, allowed: int) -> RelevoError:
    return RelevoError(ErrorCode.PLAN_TOO_LARGE, message, limit=limit, size=size, allowed=allowed)


def require_envelope_fits(envelope: JobEnvelope) -> None:
    """Refuse (PLAN_TOO_LARGE) an envelope the state machine could not carry to its dead-letter queue."""
    size = envelope_bytes(envelope)
    if size > MAX_ENVELOPE_BYTES:
        raise _too_large(
            f"the job's envelope is {size:,} bytes as the state machine carries it; at most "
            f"{MAX_ENVELOPE_BYTES:,} fit "
            f"(Step Functions' {STATE_PAYLOAD_QUOTA_BYTES:,}-byte payload quota): shorten commands or "
            "probes, or split stages",
            "envelope_bytes",
            size,
            MAX_ENVELOPE_BYTES,
        )


def require_project_fits(project: Project) -> None:
    """Refuse (PLAN_TOO_LARGE) a project whose plan is over a limit: its stages, a command or an
    effect probe, or the envelope its largest job would freeze (the longest ref, trigger and key
    a job may carry)."""
    require_stages_fit(project)
    require_shards_fit(project)
    require_shards_at_once_fit(project)
    require_envelope_fits(largest_envelope(project))


def require_shards_fit(project: Project) -> None:
    """Refuse (PLAN_TOO_LARGE) a plan whose stage runs (a stage without shards is one, a stage
    with shards one per shard) could need more execution history than the quota leaves them."""
    counts = [stage.shard_count for stage in project.frozen_stages()]
    total = sum(counts)
    if total > MAX_SHARD_RUNS:
        sharded = ", ".join(
            f"{stage.name}: {count}" for stage, count in zip(project.stages, counts, strict=True) if count > 1
        )
        raise _too_large(
            f"stages: {total} stage runs ({sharded}; 1 for each other stage); at most {MAX_SHARD_RUNS}: "
            f"{MAX_SHARD_RUNS} × {EVENTS_PER_STAGE_RUN_WORST} events at worst + {LOCK_WAIT_EVENTS:,} "
            "waiting for the project + "
            f"{JOB_EVENTS} of the job fit {1 - HISTORY_FREE_FRACTION:.0%} of Step Functions' "
            f"{HISTORY_QUOTA_EVENTS:,}-event "
            f"execution history; use fewer shards or a smaller matrix",
            "shard_runs",
            total,
            MAX_SHARD_RUNS,
        )


def require_shards_at_once_fit(project: Project) -> None:
    """Refuse (PLAN_TOO_LARGE) a stage whose shards would run more at once than an inline Map
    runs: MAX_CONCURRENT_SHARDS."""
    for index, stage in enumerate(project.frozen_stages()):
        at_once = min(stage.shard_count, stage.max_parallel or stage.shard_count)
        if not stage.sharded or at_once <= MAX_CONCURRENT_SHARDS:
            continue
        asked = (
            f"max_parallel {stage.max_parallel} (of {stage.shard_count} shards)"
            if stage.max_parallel
            else f"{stage.shard_count} shards and no max_parallel, which would run them all at once"
        )
        raise _too_large(
            f"stages.{index} ({stage.name}): {asked}; at most {MAX_CONCURRENT_SHARDS} of a stage's shards "
            "run at once "
            f"(Step Functions runs an inline Map's iterations {MAX_CONCURRENT_SHARDS} at a time): set "
            "max_parallel to "
            f"{MAX_CONCURRENT_SHARDS} or less (the other shards start as earlier ones end), or split the "
            "stage into stages "
            f"of at most {MAX_CONCURRENT_SHARDS} shards",
            "concurrent_shards",
            at_once,
            MAX_CONCURRENT_SHARDS,
        )


def require_stages_fit(project: Project) -> None:
    """Refuse (PLAN_TOO_LARGE) a project with too many stages, or a command, an effect probe or an
    effect resume over its limit."""
    if len(project.stages) > MAX_STAGES:
        raise _too_large(
            f"stages: {len(project.stages)} stages; at most {MAX_STAGES}",
            "stages",
            len(project.stages),
            MAX_STAGES,
        )
    for index, stage in enumerate(project.stages):
        for field, text, allowed in (
            ("run", stage.run, MAX_COMMAND_BYTES),
            ("effect_probe", stage.effect_probe, MAX_PROBE_BYTES),
            ("effect_resume", stage.effect_resume, MAX_COMMAND_BYTES),
        ):
            size = len((text or "").encode("utf-8"))
            if size > allowed:
                raise _too_large(
                    f"stages.{index}.{field}: {size:,} bytes; at most {allowed:,}",
                    f"{'command' if field == 'run' else field}_bytes",
                    size,
                    allowed,
                )


def largest_envelope(project: Project) -> JobEnvelope:
    """The envelope of the project's largest possible job: every field a job brings of its own
    (ref, commit, trigger, idempotency key, artifact bucket, priority, resumed stage) at its longest."""
    now = datetime(2000, 1, 1, tzinfo=UTC)
    stages = project.frozen_stages()
    longest_stage = max((stage.name for stage in stages), key=len)
    job_id = new_job_id(now.timestamp())
    return JobEnvelope(
        job_id=job_id,
        idempotency_key="k" * 512,
        project=project.id,
        region_affinity=project.region_affinity,
        artifact_uri=f"s3://{'b' * 63}/{project.id}/{job_id}/",
        created_at=now,
        ttl=10**11 - 1,
        log_ttl=10**11 - 1,
        trigger=Trigger(type=TriggerType.SCHEDULE, source="s" * 64, delivery_id="d" * 128, actor="a" * 512),
        priority=-1_000_000,
        ref="r" * 256,
        commit="f" * 64,
        stages=stages,
        queue_timeout_sec=project.queue_timeout_sec,
        exec_timeout_sec=max(stage.exec_timeout_sec for stage in stages),
        lease_ttl_sec=project.lease_ttl_sec,
        approval=project.approval,
        from_stage=longest_stage if len(stages) > 1 else None,
        retry_of=job_id,
    )
