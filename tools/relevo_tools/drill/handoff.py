"""The handoff drill: the agent that ran deliver killed right after its report, then a byte of the
stored handoff flipped while the job waits at its approval gate."""

from __future__ import annotations

import shlex
from typing import Any

from relevo_core.aws import client
from relevo_tools.drill.fleet import (
    TERMINAL_STAGE,
    DrillFleet,
)
from relevo_tools.drill.trial import DrillRun, Trial

TERMINAL_JOB_STATUSES = ("succeeded", "failed", "canceled")

# The handoff drill's tree, made by deliver and checked by announce with the stage's own digest
# (find + sha256sum, independent of the agent): a bundle's links, an executable, an empty directory.
_HANDOFF_TREE = (
    "mkdir -p out/App.app/Versions/A out/empty && head -c 300000 /dev/urandom > out/App.app/Versions/A/App "
    "&& "
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
    "  x=os.readlink(p) if stat.S_ISLNK(i.st_mode) else (hashlib.sha256(open(p,'rb').read()).hexdigest() if "
    "stat.S_ISREG(i.st_mode) else '')\n"
    "  m='' if stat.S_ISLNK(i.st_mode) else f'{i.st_mode:o} {i.st_mtime_ns}'\n"
    "  d.update(f'{p} {m} {x}'.encode())\n"
    "print(d.hexdigest())\n"
)
_TREE_DIGEST = f'"$RELEVO_DRILL_PYTHON" -c {shlex.quote(_DIGEST_PY)} out'


def _handoff_project(fleet: DrillFleet, kind: str, **settings: Any) -> str:
    deliver = (
        f'{fleet.start_marker()}; {_HANDOFF_TREE} && echo "digest=$({_TREE_DIGEST})" >> '
        f'"$RELEVO_OUTPUT" && {fleet.effect_command()}'
    )
    announce = (
        f'test "$({_TREE_DIGEST})" = "$RELEVO_OUT_DELIVER_DIGEST" && test "$(cat out/App.app/BUILD)" = '
        '"$RELEVO_JOB_ID" && '
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
            f"altered handoff: {flipped} ended {ended['status']} ({ended.get('error')}), expected failed "
            "Relevo.Fatal.Checksum"
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
