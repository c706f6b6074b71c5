"""The parallel drill (issue 32): three shards of deliver on three Macs; one shard's Mac dies
mid-run, then, in a second job with fail_fast, one shard fails for good and its siblings stop."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from relevo_core.aws import client
from relevo_core.store.codec import from_attributes
from relevo_core.store.keys import shard_sk
from relevo_tools.drill.fleet import (
    TERMINAL_STAGE,
    DrillFleet,
    GroupWatch,
    StageStart,
    wait_until,
)
from relevo_tools.drill.trial import DrillRun, LateFault, StalledFleet, Trial, epoch_seconds

# The parallel drill: three shards of deliver on three Macs; a sibling's stop after a shard fails
# for good must reach its process group within this (issue 32).
PARALLEL_SHARDS = 3
SIBLING_STOP_LIMIT_SEC = 5.0
FAILING_SHARD = 1  # the fail-fast job's shard that fails for good


def _shard_starts(fleet: DrillFleet, job_id: str) -> dict[tuple[int, int], StageStart]:
    """The starts of the shards of the job's deliver, by (shard, attempt)."""
    starts: dict[tuple[int, int], StageStart] = {}
    prefix = f"{job_id}:deliver#shard-"
    for line in fleet.starts.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0].startswith(prefix):
            key = (int(parts[0].removeprefix(prefix)), int(parts[1]))
            starts.setdefault(key, StageStart(parts[0], key[1], int(parts[2]), float(parts[3])))
    return starts


def _shard_records(fleet: DrillFleet, job_id: str) -> list[dict[str, Any]]:
    """The deliver stage's shard records, in shard order (read from the table, as holder() does)."""
    dynamodb = client("dynamodb")
    return [
        from_attributes(
            dynamodb.get_item(
                TableName=fleet.stack.table_name,
                Key={"pk": {"S": f"STAGES#{job_id}"}, "sk": {"S": shard_sk(0, shard)}},
                ConsistentRead=True,
            ).get("Item", {})
        )
        for shard in range(PARALLEL_SHARDS)
    ]


def _judge_shards(
    run: DrillRun, job_id: str, expected: str, effects_expected: dict[str, int]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's outcome, every record of it terminal, and each operation's effects as expected
    (the shards' and announce's): more is a duplicate, fewer is lost."""
    job = run.fleet.job(job_id)
    shards = _shard_records(run.fleet, job_id)
    counts = run.fleet.effect_counts(job_id)
    if job["status"] != expected:
        kind = "wrongly failed job" if expected == "succeeded" else "unexpected outcome"
        run.trial.problems.append(
            f"{kind}: {job_id} {job['status']} ({job.get('error') or '-'}), expected {expected}"
        )
    for stage in job["stages"]:
        if stage["status"] not in TERMINAL_STAGE:
            run.trial.problems.append(f"non-terminal stage: {job_id}:{stage['name']} left {stage['status']}")
    for shard, record in enumerate(shards):
        if record.get("status") not in TERMINAL_STAGE:
            run.trial.problems.append(
                f"non-terminal stage: {job_id}:deliver#shard-{shard} left {record.get('status')}"
            )
    for operation, wanted in effects_expected.items():
        landed = counts.get(operation, 0)
        run.trial.effects[operation] = landed
        if landed > wanted:
            kind = "duplicate effect" if wanted else "effect after the stop"
            run.trial.problems.append(f"{kind}: {operation} landed {landed} times, expected {wanted}")
        elif landed < wanted:
            run.trial.problems.append(f"lost effect: {operation} landed {landed} times, expected {wanted}")
    run.trial.attempts += sum(int(record.get("attempt") or 0) for record in shards)
    return job, shards


def parallel(fleet: DrillFleet, number: int) -> Trial:
    """Three shards of deliver on three Macs. (1) One shard's Mac dies mid-run (its agent and its
    command SIGKILLed): only that shard is retried, on another Mac, after its lease; its effect
    lands once, and its siblings ran once. (2) One shard fails for good with fail_fast: its
    siblings' process groups are gone within SIBLING_STOP_LIMIT_SEC of the failure, and nothing of
    theirs lands after it (their effects come effect_after_sec after the failure)."""
    run = DrillRun(fleet, "parallel", number)
    fleet.ensure_agents(PARALLEL_SHARDS)
    job_id = fleet.run(fleet.project("parallel", fan_out={"parallel": PARALLEL_SHARDS}))
    run.trial.jobs.append(job_id)
    found: dict[tuple[int, int], StageStart] = {}

    def one_started() -> bool:
        found.update(_shard_starts(fleet, job_id))
        return any(attempt == 1 for _, attempt in found)

    # The first shard to start is the one whose Mac dies (as start_job's stage): a loaded machine
    # may lose a sibling's claim answer, and that sibling then starts at its next attempt, later.
    wait_until(one_started, 60, f"{job_id}: a shard of deliver started", poll=0.05)
    seen = time.monotonic()
    victim_shard = min(shard for shard, attempt in found if attempt == 1)
    victim_start = found[(victim_shard, 1)]
    holders: dict[str, Any] = {}

    def claimed() -> bool:
        holders.update(_shard_records(fleet, job_id)[victim_shard])
        return holders.get("attempt") == 1 and holders.get("agent_id") in fleet.agents

    wait_until(claimed, 30, f"{job_id}: shard {victim_shard} claimed", poll=0.05)
    victim = fleet.agents[str(holders["agent_id"])]
    # Mid-run, after a renewal: the kill lands well before the effect would.
    time.sleep(
        max(
            0.0,
            seen
            + min(run.lease.renew_interval_sec * 1.5, fleet.timing.effect_after_sec / 4)
            - time.monotonic(),
        )
    )
    late = time.monotonic() - seen
    if late > fleet.timing.effect_after_sec / 2:
        raise LateFault(
            f"the kill came {late:.1f}s into a shard whose effect lands at {fleet.timing.effect_after_sec:g}s"
        )
    fault_wall = time.time()
    victim.process.kill()  # type: ignore[union-attr]  # the Mac dies: its agent, then its command
    victim.process.wait()  # type: ignore[union-attr]  # started above
    try:
        os.killpg(victim_start.pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # its supervisor saw the agent's pipe close first
    fleet.wait_job(job_id)
    operations = {f"{job_id}:deliver#shard-{shard}": 1 for shard in range(PARALLEL_SHARDS)} | {
        f"{job_id}:announce": 1
    }
    job, shards = _judge_shards(run, job_id, "succeeded", operations)
    retried = shards[victim_shard]
    if (retried.get("attempt"), retried.get("status")) != (2, "succeeded") or retried.get(
        "agent_id"
    ) == victim.agent_id:
        run.trial.problems.append(
            f"the killed shard ended {retried.get('status')} at attempt {retried.get('attempt')} on "
            f"{retried.get('agent_id')}, "
            f"expected succeeded at attempt 2 on another Mac than {victim.agent_id}"
        )
    # Its first attempt's outcome was never reported: the retry probes for that shard's own effect
    # (its operation id) before it runs anything.
    decision = (retried.get("reconciled") or {}).get("decision")
    if retried.get("attempt") == 2 and decision != "rerun":
        run.trial.problems.append(
            f"the killed shard's retry was not reconciled as a rerun first (decision {decision!r})"
        )
    # A sibling's command starts once (an attempt whose claim answer was lost never started it).
    starts = _shard_starts(fleet, job_id)
    again = {
        shard: sorted(a for s, a in starts if s == shard)
        for shard in range(PARALLEL_SHARDS)
        if shard != victim_shard
    }
    again = {shard: attempts for shard, attempts in again.items() if len(attempts) > 1}
    # Unless a sibling's own heartbeats lapsed on a live Mac (the emulator answering in seconds on
    # a loaded machine): that sibling is then rightly fenced and retried, effect once, and the
    # trial no longer tests the kill alone. Anything else found stands as a problem.
    lapsed = {
        shard: [
            e.get("agent")
            for e in shards[shard].get("attempts_log") or []
            if e.get("error") == "Relevo.Lease.Expired"
        ]
        for shard in again
    }
    if (
        again
        and not run.trial.problems
        and all(lapsed[shard] and victim.agent_id not in lapsed[shard] for shard in again)
    ):
        raise StalledFleet(
            f"sibling shard(s) {sorted(again)} lost their own leases on live Macs ({lapsed}): the stack "
            "stalled"
        )
    if again:
        run.trial.problems.append(
            f"siblings of the killed shard ran again: their commands started at attempts {again}"
        )
    claimed_again = epoch_seconds(retried.get("started_at"))
    run.trial.takeover_sec = (
        claimed_again - fault_wall if claimed_again and retried.get("attempt") == 2 else None
    )
    first = (
        f"{job['status']}, shard {victim_shard} (killed {victim.agent_id}) attempt {retried.get('attempt')} "
        "on "
        f"{retried.get('agent_id')} ({decision})"
    )

    # (2) fail-fast: FAILING_SHARD fails for good once all three run; the others would land their
    # effect effect_after_sec later, unless stopped first.
    fleet.heal_all()
    gate = fleet.work / "fail-fast"
    deliver = (
        f'{fleet.start_marker()}; mkdir -p "{gate}/$RELEVO_JOB_ID"; touch '
        f'"{gate}/$RELEVO_JOB_ID/$RELEVO_SHARD_INDEX"; '
        f'for _ in $(seq 600); do [ "$(ls "{gate}/$RELEVO_JOB_ID" | wc -l)" -ge {PARALLEL_SHARDS} ] && '
        "break; sleep 0.1; done; "
        f'if [ "$RELEVO_SHARD_INDEX" = {FAILING_SHARD} ]; then '
        f'"$RELEVO_DRILL_PYTHON" -c "import time; print(time.time())" > "{gate}/$RELEVO_JOB_ID.failed"; '
        f'echo "signing certificate expired"; exit 1; fi; '
        f"sleep {fleet.timing.effect_after_sec}; {fleet.effect_command()}"
    )
    stopped_job = fleet.run(
        fleet.project("parallel-fail-fast", deliver=deliver, fan_out={"parallel": PARALLEL_SHARDS})
    )
    run.trial.jobs.append(stopped_job)
    siblings = [shard for shard in range(PARALLEL_SHARDS) if shard != FAILING_SHARD]
    sibling_starts: dict[tuple[int, int], StageStart] = {}

    def siblings_started() -> bool:
        sibling_starts.update(_shard_starts(fleet, stopped_job))
        return all(any(s == shard for s, _ in sibling_starts) for shard in siblings)

    # At any attempt: the command waits up to 60 s for all three to start.
    wait_until(siblings_started, 60, f"{stopped_job}: the siblings started", poll=0.05)
    # Wall clock to monotonic, both of this host: the failure's time is the command's own clock.
    offset = time.time() - time.monotonic()
    # Every attempt of a sibling is watched: on a stalled host a sibling's first attempt can lapse
    # and be retried before the failure, and the stop to measure is that of the attempt alive then.
    watches: dict[tuple[int, int], GroupWatch] = {}

    def watch_new_starts() -> None:
        sibling_starts.update(_shard_starts(fleet, stopped_job))
        for key, start in sibling_starts.items():
            if key[0] in siblings and key not in watches:
                watches[key] = GroupWatch(start.pgid)

    watch_new_starts()
    failed_file = gate / f"{stopped_job}.failed"

    def failed() -> bool:
        watch_new_starts()
        return failed_file.exists()

    wait_until(failed, 60, f"{stopped_job}: shard {FAILING_SHARD} failed", poll=0.05)
    wait_until(
        lambda: failed_file.read_text().strip() != "", 5, f"{stopped_job}: the failure's time", poll=0.05
    )
    failed_at = float(failed_file.read_text())
    watch_new_starts()
    gone = {key: watch.wait(30) for key, watch in watches.items()}
    fleet.wait_job(stopped_job)
    # What the siblings would have landed lands effect_after_sec after the failure: wait past it.
    time.sleep(max(0.0, failed_at + fleet.timing.effect_after_sec + 1 - time.time()))
    effects = {f"{stopped_job}:deliver#shard-{shard}": 0 for shard in range(PARALLEL_SHARDS)} | {
        f"{stopped_job}:announce": 0
    }
    ended, stopped = _judge_shards(run, stopped_job, "failed", effects)
    statuses = [record.get("status") for record in stopped]
    wanted = ["failed" if shard == FAILING_SHARD else "canceled" for shard in range(PARALLEL_SHARDS)]
    if statuses != wanted:
        run.trial.problems.append(f"fail-fast: the shards ended {statuses}, expected {wanted}")
    # An attempt gone before the failure (a lapse the problems above name) had nothing to stop.
    stops = [None if at is None else at + offset - failed_at for at in gone.values()]
    alive_at_failure = [stop for stop in stops if stop is None or stop > 0]
    run.trial.fence_sec = (
        None if None in alive_at_failure else max([s for s in alive_at_failure if s is not None], default=0.0)
    )
    if run.trial.fence_sec is None or run.trial.fence_sec > SIBLING_STOP_LIMIT_SEC:
        shown = "not within 30s" if run.trial.fence_sec is None else f"{run.trial.fence_sec:.1f}s"
        run.trial.problems.append(
            f"slow stop: a sibling's process group was gone {shown} after the failure (limit "
            f"{SIBLING_STOP_LIMIT_SEC:g}s)"
        )
    stopped_in = "—" if run.trial.fence_sec is None else f"{run.trial.fence_sec:.1f}s"
    run.trial.outcome = (
        f"{first}; fail-fast: {ended['status']}, shards "
        f"{' '.join(str(s) for s in statuses)}, siblings stopped in {stopped_in}"
    )
    return run.trial
