"""The drills: each trial runs one job (exhaust: the job and its redrive) through a fault and
judges what happened. A trial's problems are what `relevo drill` fails on: a duplicate or lost
effect, a job failed that should have succeeded, a stage left non-terminal, a cancel that took
longer than CANCEL_LIMIT_SEC to reach the stage's process group, or a dead-letter entry that does
not hold what resuming needs.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from relevo_cli.api import ApiError
from relevo_core.aws import client
from relevo_core.lease_timeline import LeaseTimeline
from relevo_tools.drill.fleet import (
    TERMINAL_STAGE,
    DrillAgent,
    DrillError,
    DrillFleet,
    GroupWatch,
    StageStart,
    wait_until,
)
from relevo_tools.drill.proxy import Mode

# Issue 14: from `relevo job cancel` to SIGTERM of the stage's process group, whatever the lease.
CANCEL_LIMIT_SEC = 5.0
LATENCY_SEC = 0.5
RESET_PROBABILITY = 0.5


class LateFault(DrillError):
    """The fault could not be injected before the effect might land: not a valid trial."""


class StalledFleet(LateFault):
    """A faulted job's other operations lost their leases on live agents (the local stack answered
    too slowly for their heartbeats): they were fenced and retried, which the drill cannot tell
    from what its fault caused. Not a valid trial either."""


@dataclass
class Trial:
    drill: str
    number: int
    outcome: str = ""
    # operation id -> effect lines, for every stage of every job of the trial
    effects: dict[str, int] = field(default_factory=dict)
    fence_sec: float | None = (
        None  # fault → the faulted command's process group gone (parallel: a shard's failure → its siblings' groups gone)
    )
    takeover_sec: float | None = None  # fault → the next attempt claimed by the other agent
    cancel_sec: float | None = None  # cancel → the process group gone (SIGTERM, no trap)
    attempts: int = 0
    problems: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _seconds(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


class DrillRun:
    """One trial of one drill on the fleet."""

    def __init__(self, fleet: DrillFleet, name: str, number: int) -> None:
        self.fleet = fleet
        self.timing = fleet.timing
        self.lease = LeaseTimeline(
            self.timing.lease_ttl_sec, self.timing.kill_grace_sec, self.timing.max_clock_skew_sec
        )
        self.trial = Trial(name, number)

    # ------------------------------------------------------------------ shared steps
    def start_job(self, kind: str = "standard", **project: Any) -> tuple[str, StageStart, DrillAgent]:
        """The job, its deliver stage's first start, and the agent holding it, once the holder has
        renewed once: the fault then lands mid-stage, well before the effect."""
        job_id = self.fleet.run(self.fleet.project(kind, **project))
        self.trial.jobs.append(job_id)
        start = self.fleet.wait_stage_start(job_id)
        holder = self.fleet.holder(job_id, 1)
        lead = min(self.lease.renew_interval_sec * 1.5, self.timing.effect_after_sec / 4)
        time.sleep(max(0.0, start.seen + lead - time.monotonic()))
        late = time.monotonic() - start.seen
        if late > self.timing.effect_after_sec / 2:
            # A loaded machine kept the drill from faulting in time: the effect could land first.
            raise LateFault(
                f"the fault came {late:.1f}s into a stage whose effect lands at {self.timing.effect_after_sec:g}s"
            )
        return job_id, start, holder

    def judge(self, job_id: str, expected: str, fault_wall: float | None = None) -> dict[str, Any]:
        job = self.fleet.job(job_id)
        counts = self.fleet.effect_counts(job_id)
        if job["status"] != expected:
            kind = "wrongly failed job" if expected == "succeeded" else "unexpected outcome"
            self.trial.problems.append(
                f"{kind}: {job_id} {job['status']} ({job.get('error') or '-'}), expected {expected}"
            )
        for stage in job["stages"]:
            operation = f"{job_id}:{stage['name']}"
            effects = counts.get(operation, 0)
            self.trial.effects[operation] = effects
            if stage["status"] not in TERMINAL_STAGE:
                self.trial.problems.append(f"non-terminal stage: {operation} left {stage['status']}")
            if effects > 1:
                self.trial.problems.append(f"duplicate effect: {operation} landed {effects} times")
            if stage["status"] == "succeeded" and effects == 0:
                self.trial.problems.append(f"lost effect: {operation} succeeded without its effect")
        deliver = job["stages"][0]
        self.trial.attempts += deliver.get("attempt") or 0
        if fault_wall is not None and (deliver.get("attempt") or 0) > 1:
            claimed = _seconds(deliver.get("started_at"))
            self.trial.takeover_sec = claimed - fault_wall if claimed else None
        return job

    def fenced(self, watch: GroupWatch, fault_mono: float, limit: float) -> None:
        gone = watch.wait(limit)
        self.trial.fence_sec = gone - fault_mono if gone is not None else None

    def describe(self, job: dict[str, Any]) -> str:
        deliver = job["stages"][0]
        attempts = deliver.get("attempt") or 0
        decision = (deliver.get("reconciled") or {}).get("decision")
        words = f"{job['status']}"
        if attempts > 1:
            words += f", attempt {attempts} on {deliver.get('agent_id')}"
        if decision:
            words += f" ({decision})"
        return words


Drill = Callable[[DrillFleet, int], Trial]


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
    if name == "short-partition" and (job["stages"][0].get("attempt") or 0) == 1:
        run.trial.fence_sec = None  # the command ran to its end: nothing was fenced
    run.trial.outcome = run.describe(job)
    return run.trial


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
    return _cut_off(
        fleet,
        number,
        "kill-stage",
        lambda _, start: os.kill(start.pgid, signal.SIGKILL),
        lambda agent: None,
        0,
    )


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
            f"slow cancel: the stage's group was still running {run.trial.cancel_sec or 30:.1f}s after the cancel"
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
            body = json.loads(message["Body"])
            if body.get("job_id") == job_id:
                return body
    return None


# The handoff drill's tree, made by deliver and checked by announce with the stage's own digest
# (find + sha256sum, independent of the agent): a bundle's links, an executable, an empty directory.
_HANDOFF_TREE = (
    "mkdir -p out/App.app/Versions/A out/empty && head -c 300000 /dev/urandom > out/App.app/Versions/A/App && "
    "chmod 755 out/App.app/Versions/A/App && ln -s A out/App.app/Versions/Current && "
    "echo $RELEVO_JOB_ID > out/App.app/BUILD && touch -t 202001020304.05 out/App.app/BUILD"
)
# One sha256 over the tree as the stage sees it on its own disk: each path's type, mode, mtime (ns),
# bytes or link target. Run by the stage with the drill's Python, not by relevo-agent.
_DIGEST_PY = (
    "import hashlib,os,stat,sys\n"
    "d=hashlib.sha256()\n"
    "for r,ds,fs in sorted(os.walk(sys.argv[1])):\n"
    " for n in sorted(ds+fs):\n"
    "  p=os.path.join(r,n); i=os.lstat(p)\n"
    "  x=os.readlink(p) if stat.S_ISLNK(i.st_mode) else (hashlib.sha256(open(p,'rb').read()).hexdigest() if stat.S_ISREG(i.st_mode) else '')\n"
    "  m='' if stat.S_ISLNK(i.st_mode) else f'{i.st_mode:o} {i.st_mtime_ns}'\n"
    "  d.update(f'{p} {m} {x}'.encode())\n"
    "print(d.hexdigest())\n"
)
_TREE_DIGEST = f'"$RELEVO_DRILL_PYTHON" -c {shlex.quote(_DIGEST_PY)} out'


def _handoff_project(fleet: DrillFleet, kind: str, **settings: Any) -> str:
    deliver = f'{fleet.start_marker()}; {_HANDOFF_TREE} && echo "digest=$({_TREE_DIGEST})" >> "$RELEVO_OUTPUT" && {fleet.effect_command()}'
    announce = (
        f'test "$({_TREE_DIGEST})" = "$RELEVO_OUT_DELIVER_DIGEST" && test "$(cat out/App.app/BUILD)" = "$RELEVO_JOB_ID" && '
        f"{fleet.effect_command()}"
    )
    return fleet.project(kind, deliver=deliver, announce=announce, handoff=["out"], **settings)


def handoff(fleet: DrillFleet, number: int) -> Trial:
    """Two faults of the handoff. (1) The agent that ran deliver is SIGKILLed right after its
    report: announce runs on the other Mac, restores byte-identical files (its own digest of
    them equals deliver's) and lands its effect once. (2) A byte flipped in the stored handoff
    while the job waits at an approval gate: announce fails Relevo.Fatal.Checksum, not retried,
    and runs nothing."""
    run = DrillRun(fleet, "handoff", number)
    job_id = fleet.run(_handoff_project(fleet, "handoff"))
    run.trial.jobs.append(job_id)
    fleet.wait_stage_start(job_id)
    reported = fleet.wait_job(
        job_id,
        lambda job: job["stages"][0]["status"] == "succeeded" or job["status"] in ("failed", "canceled"),
    )
    builder = fleet.agents.get(str(reported["stages"][0].get("agent_id")))
    if builder is not None and builder.alive():
        builder.process.kill()  # type: ignore[union-attr]  # alive(): it has one
        builder.process.wait()  # type: ignore[union-attr]  # alive(): it has one
    job = fleet.wait_job(job_id)
    run.judge(job_id, "succeeded")
    deliver, announce = job["stages"][0], job["stages"][1]
    # The builder holds deliver's files, so placement offers it announce first: on a slow machine it
    # claims announce before the kill reaches it (the drill sees deliver's report by polling). The
    # other Mac then decides that attempt from the receipt it left and downloads nothing; the trial
    # still holds when the effects land once (run.judge), but it did not test a download.
    taken_by_builder = builder is not None and any(
        entry.get("agent") == builder.agent_id for entry in announce.get("attempts_log", [])
    )
    if builder is not None and announce.get("agent_id") == builder.agent_id:
        run.trial.problems.append(f"announce ran on {builder.agent_id}, the agent killed after deliver")
    if not taken_by_builder:
        if (announce.get("handoff") or {}).get("restored_digest") != (deliver.get("handoff") or {}).get(
            "digest"
        ):
            run.trial.problems.append("the restored tree's digest is not the one deliver stored")
        if job["status"] == "succeeded" and (announce.get("handoff") or {}).get("restored_bytes", 0) <= 0:
            run.trial.problems.append("announce ran on another Mac without downloading the handoff")
    first = (
        run.describe(job)
        + f", announce on {announce.get('agent_id')}"
        + (
            f" (its first attempt was the killed {builder.agent_id}'s, decided from its receipt)"
            if taken_by_builder and builder
            else ""
        )
    )

    # (2) The byte flip, at an approval gate between the two stages.
    fleet.heal_all()
    flipped = fleet.run(
        _handoff_project(fleet, "handoff-gate", approval={"enabled": True, "before": "announce"})
    )
    run.trial.jobs.append(flipped)
    gated = fleet.wait_job(
        flipped, lambda j: j["status"] == "waiting" or j["status"] in TERMINAL_JOB_STATUSES
    )
    # The Mac that stored it stops (a clean stop: offline at once), so announce restores on the
    # other one, from storage: a same-Mac restore reads its own verified copies, not the store.
    holder = fleet.agents.get(str(gated["stages"][0].get("agent_id")))
    if holder is not None:
        holder.stop()
    stored = str((fleet.job(flipped)["stages"][0].get("handoff") or {}).get("manifest", ""))
    bucket, _, key = stored.removeprefix("s3://").partition("/")
    prefix = key[: key.rfind("manifests/")]
    s3 = client("s3")
    packs = [
        item["Key"]
        for item in s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}packs/").get("Contents", [])
    ]
    if not packs:
        run.trial.problems.append(f"no stored pack to alter under s3://{bucket}/{prefix}")
    for pack in packs:
        data = bytearray(s3.get_object(Bucket=bucket, Key=pack)["Body"].read())
        if data:
            data[len(data) // 2] ^= 0x01
        s3.put_object(Bucket=bucket, Key=pack, Body=bytes(data))
    fleet.api.approve(flipped, "drill: the handoff was altered in storage")
    ended = fleet.wait_job(flipped)
    counts = fleet.effect_counts(flipped)
    if ended["status"] != "failed" or ended.get("error") != "Relevo.Fatal.Checksum":
        run.trial.problems.append(
            f"altered handoff: {flipped} ended {ended['status']} ({ended.get('error')}), expected failed Relevo.Fatal.Checksum"
        )
    if counts.get(f"{flipped}:announce", 0):
        run.trial.problems.append(
            f"altered handoff: announce ran ({counts[f'{flipped}:announce']} effect(s)) on altered files"
        )
    if (ended["stages"][1].get("attempt") or 0) > 1:
        run.trial.problems.append("altered handoff: a checksum failure was retried")
    if counts.get(f"{flipped}:deliver", 0) != 1:
        run.trial.problems.append(
            f"altered handoff: deliver's effect landed {counts.get(f'{flipped}:deliver', 0)} times"
        )
    for stage in ended["stages"]:
        if stage["status"] not in TERMINAL_STAGE:
            run.trial.problems.append(f"non-terminal stage: {flipped}:{stage['name']} left {stage['status']}")
    run.trial.effects.update({op: n for op, n in counts.items()})
    run.trial.outcome = f"{first}; altered: {ended['status']} {ended.get('error') or ''}".strip()
    fleet.heal_all()
    return run.trial


TERMINAL_JOB_STATUSES = ("succeeded", "failed", "canceled")


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
    from relevo_core.store.codec import from_attributes
    from relevo_core.store.keys import shard_sk

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
            f"the killed shard ended {retried.get('status')} at attempt {retried.get('attempt')} on {retried.get('agent_id')}, "
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
            f"sibling shard(s) {sorted(again)} lost their own leases on live Macs ({lapsed}): the stack stalled"
        )
    if again:
        run.trial.problems.append(
            f"siblings of the killed shard ran again: their commands started at attempts {again}"
        )
    claimed_again = _seconds(retried.get("started_at"))
    run.trial.takeover_sec = (
        claimed_again - fault_wall if claimed_again and retried.get("attempt") == 2 else None
    )
    first = (
        f"{job['status']}, shard {victim_shard} (killed {victim.agent_id}) attempt {retried.get('attempt')} on "
        f"{retried.get('agent_id')} ({decision})"
    )

    # (2) fail-fast: FAILING_SHARD fails for good once all three run; the others would land their
    # effect effect_after_sec later, unless stopped first.
    fleet.heal_all()
    gate = fleet.work / "fail-fast"
    deliver = (
        f'{fleet.start_marker()}; mkdir -p "{gate}/$RELEVO_JOB_ID"; touch "{gate}/$RELEVO_JOB_ID/$RELEVO_SHARD_INDEX"; '
        f'for _ in $(seq 600); do [ "$(ls "{gate}/$RELEVO_JOB_ID" | wc -l)" -ge {PARALLEL_SHARDS} ] && break; sleep 0.1; done; '
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
    first_starts = {
        shard: sibling_starts[min(key for key in sibling_starts if key[0] == shard)] for shard in siblings
    }
    watches = {shard: GroupWatch(start.pgid) for shard, start in first_starts.items()}
    failed_file = gate / f"{stopped_job}.failed"
    wait_until(failed_file.exists, 60, f"{stopped_job}: shard {FAILING_SHARD} failed", poll=0.05)
    wait_until(
        lambda: failed_file.read_text().strip() != "", 5, f"{stopped_job}: the failure's time", poll=0.05
    )
    failed_at = float(failed_file.read_text())
    gone = {shard: watch.wait(30) for shard, watch in watches.items()}
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
    stops = [None if at is None else at + offset - failed_at for at in gone.values()]
    run.trial.fence_sec = None if None in stops else max(s for s in stops if s is not None)
    if run.trial.fence_sec is None or run.trial.fence_sec > SIBLING_STOP_LIMIT_SEC:
        shown = "not within 30s" if run.trial.fence_sec is None else f"{run.trial.fence_sec:.1f}s"
        run.trial.problems.append(
            f"slow stop: a sibling's process group was gone {shown} after the failure (limit {SIBLING_STOP_LIMIT_SEC:g}s)"
        )
    stopped_in = "—" if run.trial.fence_sec is None else f"{run.trial.fence_sec:.1f}s"
    run.trial.outcome = f"{first}; fail-fast: {ended['status']}, shards {' '.join(str(s) for s in statuses)}, siblings stopped in {stopped_in}"
    return run.trial


DRILLS: dict[str, Drill] = {
    "partition": partition,
    "short-partition": short_partition,
    "freeze": freeze,
    "kill": kill,
    "kill-stage": kill_stage,
    "resets": resets,
    "latency": latency,
    "cancel": cancel,
    "exhaust": exhaust,
    "handoff": handoff,
    "parallel": parallel,
}
