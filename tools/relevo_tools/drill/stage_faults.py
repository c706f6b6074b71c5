"""The drills that fault one stage's holder or its network: partition (short and long), freeze,
kill (the agent or the stage's own process), resets, latency, cancel (a cancel that takes longer
than CANCEL_LIMIT_SEC to reach the stage's process group is a problem) and exhaust (a dead-letter
entry that does not hold what resuming needs is one)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from relevo_cli.api import ApiError
from relevo_core.aws import client
from relevo_core.fleet.lease_timeline import LeaseTimeline
from relevo_core.models.errors import ErrorClass
from relevo_tools.drill.fleet import (
    DrillFleet,
    GroupWatch,
    StageStart,
    wait_until,
)
from relevo_tools.drill.proxy import Mode
from relevo_tools.drill.trial import DrillRun, LateFault, StalledFleet, Trial

# Issue 14: from `relevo job cancel` to SIGTERM of the stage's process group, whatever the lease.
CANCEL_LIMIT_SEC = 5.0
LATENCY_SEC = 0.5
RESET_PROBABILITY = 0.5


def _cut_off(
    fleet: DrillFleet,
    number: int,
    name: str,
    fault: Callable[[Any, StageStart], None],
    heal: Callable[[Any], None],
    hold_sec: float,
) -> Trial:
    """A fault on the agent holding the stage, mid-stage, held for `hold_sec`, then healed."""
    run = DrillRun(fleet, name, number)
    job_id, start, holder = run.start_job()
    watch = GroupWatch(start.pgid)
    fault_wall, fault_mono = time.time(), time.monotonic()
    fault(holder, start)
    time.sleep(hold_sec)
    heal(holder)
    job = fleet.wait_job(job_id)
    run.fenced(watch, fault_mono, 5)
    run.judge(job_id, "succeeded", fault_wall)
    if name in ONE_TAKEOVER:
        judge_takeover(run.trial, job, holder.agent_id)
    if name == "short-partition" and (job["stages"][0].get("attempt") or 0) == 1:
        run.trial.fence_sec = None  # the command ran to its end: nothing was fenced
    run.trial.outcome = run.describe(job)
    return run.trial


# The drills whose fault ends the holder's attempt and whose next attempt, the other agent's, is
# the last: its lease holds, as the un-faulted Mac's should.
ONE_TAKEOVER = ("partition", "freeze")


def judge_takeover(trial: Trial, job: dict[str, Any], holder_id: str) -> None:
    """What came after the takeover. When each later attempt that failed lost its lease on a live Mac
    (the local stack answered too slowly for its heartbeats, on a loaded machine) and nothing else
    went wrong, the trial no longer tests the fault alone: the fleet stalled, run it again. Any
    other later failure is a problem."""
    deliver = job["stages"][0]
    later = [entry for entry in deliver.get("attempts_log") or [] if (entry.get("attempt") or 0) >= 2]
    if not later:
        return
    lapsed_on_live_macs = all(
        entry.get("error") == ErrorClass.LEASE_EXPIRED and entry.get("agent") != holder_id for entry in later
    )
    if lapsed_on_live_macs and not trial.problems:
        raise StalledFleet(
            f"the takeover's attempt lost its lease on a live Mac ({later}): the stack stalled"
        )
    trial.problems.append(f"the takeover did not hold: attempts after the first failed ({later})")


def partition(fleet: DrillFleet, number: int) -> Trial:
    """The holder's network is black-holed for twice the lease: it must fence before its lease
    ends, and the other agent's attempt must find no effect yet and run it once."""
    hold = 2 * fleet.timing.lease_ttl_sec
    return _cut_off(
        fleet,
        number,
        "partition",
        lambda agent, _: agent.proxy.partition(),
        lambda agent: agent.proxy.heal(),
        hold,
    )


def short_partition(fleet: DrillFleet, number: int) -> Trial:
    """Shorter than the fence window: renewals resume, nothing is fenced or taken over."""
    lease = LeaseTimeline(
        fleet.timing.lease_ttl_sec, fleet.timing.kill_grace_sec, fleet.timing.max_clock_skew_sec
    )
    hold = 0.6 * (lease.fence_after_sec - lease.renew_interval_sec)
    return _cut_off(
        fleet,
        number,
        "short-partition",
        lambda agent, _: agent.proxy.partition(),
        lambda agent: agent.proxy.heal(),
        hold,
    )


def freeze(fleet: DrillFleet, number: int) -> Trial:
    """SIGSTOP of the holder's pid alone for twice the lease: its dead-man supervisor, a process
    of its own, kills the stage's group when the lease deadline passes unextended."""
    hold = 2 * fleet.timing.lease_ttl_sec
    return _cut_off(
        fleet,
        number,
        "freeze",
        lambda agent, _: os.kill(agent.pid, signal.SIGSTOP),
        lambda agent: os.kill(agent.pid, signal.SIGCONT),
        hold,
    )


def kill(fleet: DrillFleet, number: int) -> Trial:
    """SIGKILL of the holder: its supervisor sees the pipe close and kills the group at once."""

    def sigkill(agent: Any, _: StageStart) -> None:
        agent.process.kill()
        agent.process.wait()

    return _cut_off(fleet, number, "kill", sigkill, lambda agent: None, 0)


def kill_stage(fleet: DrillFleet, number: int) -> Trial:
    """SIGKILL of the stage's own process (its bash leader): the outcome is unknown, so the
    retry reconciles before it runs anything."""
    return _cut_off(fleet, number, "kill-stage", kill_stage_leader, lambda agent: None, 0)


def kill_stage_leader(_agent: Any, start: StageStart) -> None:
    """SIGKILL of the stage's leader. One already gone was ended before the fault (its holder
    fenced it when a loaded machine let its lease lapse, or the command finished): the trial's
    premise, a stage killed while it runs, never held, so it is not a valid trial (run again)
    rather than a drill error."""
    try:
        os.kill(start.pgid, signal.SIGKILL)
    except ProcessLookupError:
        raise LateFault(f"the stage's leader {start.pgid} had already exited when the kill came") from None


def _whole_job_under(
    fleet: DrillFleet, number: int, name: str, mode: Mode, until_started: bool, **mode_settings: Any
) -> Trial:
    run = DrillRun(fleet, name, number)
    for agent in fleet.agents.values():
        agent.proxy.set_mode(mode, **mode_settings)
    try:
        job_id = fleet.run(fleet.project("standard"))
        run.trial.jobs.append(job_id)
        # Under resets, any attempt: a claim whose answer the resets held past its lease is fenced
        # before its stage starts (the agent's local deadline), and the next attempt starts. Under
        # latency alone, the first attempt must be the one that starts (never fenced).
        fleet.wait_stage_start(job_id, attempt=None if until_started else 1)
        if until_started:
            for agent in fleet.agents.values():
                agent.proxy.heal()
        job = fleet.wait_job(job_id)
    finally:
        for agent in fleet.agents.values():
            agent.proxy.heal()
    run.judge(job_id, "succeeded")
    run.trial.outcome = run.describe(job)
    return run.trial


def resets(fleet: DrillFleet, number: int) -> Trial:
    """Half of every agent's requests are reset from the trigger until the stage has started: the
    receive, the envelope read, the claim and its answer all meet resets and must hand the
    message back or retry, never crash the handling."""
    return _whole_job_under(fleet, number, "resets", Mode.RESET, True, reset_probability=RESET_PROBABILITY)


def latency(fleet: DrillFleet, number: int) -> Trial:
    """500 ms on every request of both agents for the whole job: slow, never fenced."""
    return _whole_job_under(fleet, number, "latency", Mode.LATENCY, False, latency_sec=LATENCY_SEC)


def cancel(fleet: DrillFleet, number: int) -> Trial:
    """`relevo job cancel` mid-stage: SIGTERM reaches the group within CANCEL_LIMIT_SEC whatever the
    lease, the job ends canceled and no stage of it stays running."""
    run = DrillRun(fleet, "cancel", number)
    job_id, start, _ = run.start_job()
    watch = GroupWatch(start.pgid)
    canceled = time.monotonic()
    fleet.api.cancel_job(job_id)
    gone = watch.wait(30)
    run.trial.cancel_sec = gone - canceled if gone is not None else None
    if run.trial.cancel_sec is None or run.trial.cancel_sec > CANCEL_LIMIT_SEC:
        run.trial.problems.append(
            f"slow cancel: the stage's group was still running {run.trial.cancel_sec or 30:.1f}s after the "
            "cancel"
        )
    job = fleet.wait_job(job_id)
    # Settled once the agent let go of it; a stage a holder still shows would be non-terminal.
    time.sleep(run.lease.renew_interval_sec)
    job = run.judge(job_id, "canceled")
    run.trial.outcome = f"{job['status']}, deliver {job['stages'][0]['status']}"
    return run.trial


def exhaust(fleet: DrillFleet, number: int) -> Trial:
    """The second stage fails (exit 75, transient) until its attempts run out; the dead-letter
    entry must hold the envelope, the last good stage, the attempts and the log pointer; once the
    fault is fixed, `relevo dlq redrive` resumes from the failed stage and runs it once."""
    run = DrillRun(fleet, "exhaust", number)
    fixed = fleet.work / f"exhaust-fixed-{number}"
    announce = (
        f'[ -f {fixed} ] || {{ echo "announce attempt $RELEVO_ATTEMPT: the store is down"; exit 75; }}; '
        f"{fleet.effect_command()}"
    )
    # A project per trial: its announce command names this trial's "fixed" file (projects are
    # registered once per kind, and an earlier trial's file is there already).
    project = fleet.project(
        f"exhaust-{number}",
        deliver=fleet.effect_command(),
        announce=announce,
        retry={"backoff_base_sec": 0, "attempts": {"Relevo.Transient.ExitCode": 2}},
    )
    job_id = fleet.run(project)
    run.trial.jobs.append(job_id)
    failed = fleet.wait_job(job_id)
    run.judge(job_id, "failed")
    run.trial.problems += _dead_letter_problems(fleet, job_id)
    wait_until(
        lambda: _has_dead_letter(fleet, job_id), 30, f"{job_id} in relevo dlq"
    )  # recorded after the queue's message
    fixed.touch()
    resumed_id = str(fleet.api.redrive(job_id)["job_id"])
    run.trial.jobs.append(resumed_id)
    fleet.wait_job(resumed_id)
    resumed = run.judge(resumed_id, "succeeded")
    if resumed["stages"][0]["status"] != "skipped":
        run.trial.problems.append(f"redrive ran {resumed_id}:deliver again instead of resuming from announce")
    run.trial.attempts = failed["stages"][1].get("attempt") or 0
    run.trial.outcome = f"failed after {run.trial.attempts} attempts, redriven: {resumed['status']}"
    return run.trial


def _has_dead_letter(fleet: DrillFleet, job_id: str) -> bool:
    try:
        fleet.api.dead_letter(job_id)
    except ApiError:
        return False
    return True


def _dead_letter_problems(fleet: DrillFleet, job_id: str) -> list[str]:
    """What the job dead-letter queue's message for `job_id` lacks to resume the job."""
    message = _dead_letter_message(fleet, job_id)
    if message is None:
        return [f"dead letter: no message for {job_id} in the job DLQ"]
    problems = []
    envelope = message.get("envelope") or {}
    if envelope.get("job_id") != job_id or not envelope.get("stages"):
        problems.append("dead letter: no envelope")
    last_good = (message.get("job_record") or {}).get("last_successful_stage", {})
    if (last_good.get("S") if isinstance(last_good, dict) else last_good) != "deliver":
        problems.append(f"dead letter: last good stage {last_good!r}, expected deliver")
    try:
        detail = json.loads(message.get("cause") or "")
    except ValueError:
        detail = {}
    if (detail.get("stage"), detail.get("attempts")) != ("announce", 2):
        problems.append(
            f"dead letter: failed stage and attempts {detail.get('stage')!r}/{detail.get('attempts')!r}"
        )
    if message.get("logs") != f"/jobs/{job_id}/logs":
        problems.append(f"dead letter: log pointer {message.get('logs')!r}")
    else:
        chunks = fleet.api.job_logs(job_id).get("chunks", [])
        if not any(
            "the store is down" in chunk.get("text", "")
            for chunk in chunks
            if chunk.get("stage") == "announce"
        ):
            problems.append("dead letter: the log pointer leads to no output of the failed stage")
    return problems


def _dead_letter_message(fleet: DrillFleet, job_id: str, timeout: float = 20) -> dict[str, Any] | None:
    """Peek at the job DLQ (each message received is visible again at once)."""
    queue_url = str(fleet.stack.resources["JobDeadLetterQueue"])
    sqs = client("sqs")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for message in sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=0
        ).get("Messages", []):
            body: dict[str, Any] = json.loads(message["Body"])
            if body.get("job_id") == job_id:
                return body
    return None
