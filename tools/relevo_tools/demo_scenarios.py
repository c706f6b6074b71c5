"""The scenarios of `make demo` (see relevo_tools.demo) besides the release (demo_release.py), each
on its own project so they run side by side: the fleet online, a transient retry on the region's
other agent, the dead-letter queue and its redrive, an agent killed mid-upload, a build handed to
three test shards."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from relevo_cli.api import ApiError
from relevo_core.aws import client
from relevo_core.store import agents
from relevo_core.store.codec import from_attributes
from relevo_core.store.keys import shard_sk
from relevo_local.processes import random_commit
from relevo_tools.demo_harness import (
    CAPACITY,
    FLEET,
    TERMINAL,
    Demo,
    ScenarioResult,
    expect,
    seconds_between,
    stage,
)
from relevo_tools.demo_release import apple_uploads

# ------------------------------------------------------------------------------------ scenarios
FLEET_SCENARIO = f"{len(FLEET)} regions, every agent online"
RETRY_SCENARIO = "transient failure retried on another agent"


def scenario_fleet(demo: Demo) -> ScenarioResult:
    """Both regions have both their agents online (their presence records)."""
    deadline = time.monotonic() + 90
    while True:
        now = datetime.now(UTC)
        online = {
            region: sorted(a.agent_id for a in agents.online_agents(demo.stack.table_name, region, now))
            for region in FLEET
        }
        if all(set(online[region]) >= set(ids) for region, ids in FLEET.items()):
            break
        for agent_id, process in demo.agents.items():
            log = demo.work / f"{agent_id}.log"
            expect(process.poll() is None, f"relevo-agent {agent_id} exited {process.returncode}; see {log}")
        expect(time.monotonic() < deadline, f"agents online after 90 s: {online}")
        demo.pause()
    evidence = [
        f"{region}: {', '.join(ids)} (capacity {CAPACITY[region]} each)" for region, ids in online.items()
    ]
    demo.say("fleet", "online: " + " · ".join(evidence))
    return ScenarioResult(FLEET_SCENARIO, True, evidence)


def scenario_retry(demo: Demo) -> ScenarioResult:
    """Exit 75 on attempt 1 (transient) and the retry on the region's other agent."""
    tag = "retry"
    job_id = demo.run("flaky-tests", random_commit())
    demo.say(tag, f"flaky-tests run → job {job_id}")
    job = demo.watch(tag, job_id)
    test = stage(job, "test")
    log = test["attempts_log"]
    expect(job["status"] == "succeeded", f"job ended {job['status']}: {job.get('error')}")
    expect(len(log) == 1 and log[0]["error"] == "Relevo.Transient.ExitCode", f"failed attempts: {log}")
    first, second = log[0]["agent"], test["agent_id"]
    expect(
        test["attempt"] == 2 and first != second,
        f"attempt 1 on {first}, attempt {test['attempt']} on {second}",
    )
    return ScenarioResult(
        RETRY_SCENARIO,
        True,
        [
            f"attempt 1 on {first}: exit 75 → {log[0]['error']}",
            f"attempt 2 on {second}: succeeded (retry_count {test['retry_count']})",
        ],
    )


def dead_letter(demo: Demo, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return demo.api.dead_letter(job_id)
        except ApiError as exc:
            expect(exc.code == "DLQ_ENTRY_NOT_FOUND", f"GET /dlq/{job_id}: {exc}")
            expect(time.monotonic() < deadline, f"no DLQ entry for {job_id} after {timeout:.0f}s")
        demo.pause()


def scenario_dlq(demo: Demo) -> ScenarioResult:
    """A non-retryable failure in the DLQ, redriven from its failed stage to success."""
    tag = "dlq"
    commit = random_commit()
    job_id = demo.run("notarize", commit)
    demo.say(tag, f"notarize run → job {job_id}")
    job = demo.watch(tag, job_id)
    expect(job["status"] == "failed", f"job ended {job['status']}, not failed")
    entry = dead_letter(demo, job_id)
    demo.say(
        tag,
        f"DLQ entry: failed stage {entry['failed_stage']}, {entry['error']}, {entry['attempts']} attempt(s), "
        f"last good stage {entry['last_successful_stage']}",
    )
    expect(
        (
            entry["failed_stage"],
            entry["error"],
            entry["attempts"],
            entry["last_successful_stage"],
            entry["state"],
        )
        == ("notarize", "Relevo.Fatal.ExitCode", 1, "archive", "open"),
        f"DLQ entry {entry}",
    )
    (demo.shared / "notary-ticket").write_text("T-2024-0042\n")
    demo.say(tag, "renewed the notary agreement (wrote the ticket file)")
    demo.cli(tag, "dlq", "redrive", job_id)
    entry = demo.api.dead_letter(job_id)
    resumed_id = entry["redriven_as"]
    expect(entry["state"] == "redriven" and resumed_id, f"after redrive the entry is {entry}")
    demo.track(resumed_id)
    resumed = demo.watch(tag, resumed_id)
    statuses = [s["status"] for s in resumed["stages"]]
    expect(
        resumed["status"] == "succeeded",
        f"the redriven job ended {resumed['status']}: {resumed.get('error')}",
    )
    lineage = (resumed["retry_of"], resumed["from_stage"], statuses)
    expected = (job_id, "notarize", ["skipped", "succeeded", "succeeded"])
    expect(lineage == expected, f"redriven job (retry_of, from_stage, stages): {lineage}")
    # The same run asked for again is the resumed job: the redrive kept the idempotency key.
    same = demo.api.run_project("notarize", {"ref": "main", "commit": commit})
    demo.say(tag, f"the same run again → {json.dumps(same)}")
    expect(
        same.get("duplicate") is True and same.get("job_id") == resumed_id,
        f"the same run again answered {same}",
    )
    return ScenarioResult(
        "non-retryable failure → DLQ → redriven",
        True,
        [
            f"{job_id}: notarize exit 1 → {entry['error']} (1 attempt)",
            f"redriven as {resumed_id} from notarize (archive skipped) → succeeded",
            f"same key {entry['idempotency_key'][:24]}…: a new run → duplicate of {resumed_id}",
        ],
    )


def scenario_kill(demo: Demo) -> ScenarioResult:
    """The agent running the app_store_upload is SIGKILLed once App Store Connect has its bytes,
    while Apple is still processing the build; the lease expires and the other agent reconciles
    the attempt with the kind's probe: found done (or still processing, and waited for), never
    uploaded again."""
    tag = "kill"
    job_id = demo.run("store-upload", random_commit())
    demo.say(tag, f"store-upload run → job {job_id}")

    job = demo.watch(tag, job_id, lambda j: stage(j, "upload")["status"] == "running")
    # Apple has the file (committed) and the attempt waits for its processing: a few seconds, so
    # the local Apple service is watched here, not through the job.
    deadline = time.monotonic() + 60
    while not [u for u in apple_uploads(demo, "store-upload") if u[3] != "AWAITING_UPLOAD"]:
        expect(time.monotonic() < deadline, "App Store Connect had no committed upload after 60 s")
        expect(not demo.stopping.wait(0.05), "interrupted")
    victim = stage(job, "upload")["agent_id"]
    demo.agents[victim].kill()  # SIGKILL: no handler runs, nothing is reported
    demo.agents[victim].wait()
    try:
        killed_at = datetime.now(UTC).isoformat()
        arrived = apple_uploads(demo, "store-upload")
        demo.say(
            tag,
            f"[bold]SIGKILL {victim}[/bold] (pid {demo.agents[victim].pid}) mid-upload: App Store Connect "
            f"had upload {arrived[0][0]} ({arrived[0][3]})",
        )
        # Once another Mac has taken attempt 2, the victim starts again, as launchd's KeepAlive
        # would (release-app's sign requires it).
        demo.watch(
            tag,
            job_id,
            lambda j: j["status"] in TERMINAL
            or (
                stage(j, "upload")["attempt"] >= 2
                and stage(j, "upload")["status"] in ("running", "succeeded")
            ),
        )
        demo.restart(victim)
        demo.say(tag, f"{victim} started again (as launchd's KeepAlive would)")
        job = demo.watch(tag, job_id, timeout=120)
        upload = stage(job, "upload")
        reconciled = upload.get("reconciled") or {}
        evidence = reconciled.get("evidence") or {}
        log = upload["attempts_log"]
        if reconciled:
            demo.say(
                tag,
                f"reconciliation by {reconciled.get('agent_id')} (attempt {reconciled.get('attempt')}): "
                f"[bold]{reconciled.get('decision')}[/bold] · probe exit {evidence.get('probe_exit')}, "
                f"{str(evidence.get('probe_output', '')).strip()!r} · previous agent "
                f"{evidence.get('previous_agent')}",
            )
        outputs = upload["outputs"]
        uploads = apple_uploads(demo, "store-upload")
        demo.say(
            tag,
            f"upload {outputs.get('upload_id')}: StoreApp {outputs.get('build_version')} "
            f"({outputs.get('build_number')}), Apple's state {outputs.get('apple_state')}; the local Apple "
            f"service holds {len(uploads)} build upload(s) of the app",
        )
        expect(job["status"] == "succeeded", f"job ended {job['status']}: {job.get('error')}")
        expect(
            [(e["attempt"], e["agent"], e["error"]) for e in log] == [(1, victim, "Relevo.Lease.Expired")],
            f"failed attempts: {log}",
        )
        expect(
            upload["agent_id"] != victim and upload["attempt"] == 2,
            f"attempt {upload['attempt']} on {upload['agent_id']}",
        )
        # Found done (exit 0), or still processing (118) and resumed: waited for, not sent again.
        expect(
            (reconciled.get("decision"), evidence.get("probe_exit")) in (("succeeded", 0), ("resume", 118)),
            f"reconciliation {reconciled}",
        )
        expect(
            [(u[0], u[2], u[3]) for u in uploads]
            == [(outputs.get("upload_id"), str(job.get("build_number")), "VALID")],
            f"App Store Connect holds {uploads}; the stage says {outputs}",
        )
        lapse = seconds_between(killed_at, log[0].get("at"))
        return ScenarioResult(
            "agent SIGKILLed mid-upload, upload reconciled",
            True,
            [
                f"{victim} killed during attempt 1, Apple processing the build → {log[0]['error']}"
                + (f" {lapse:.1f}s later" if lapse is not None else ""),
                f"{upload['agent_id']} probed App Store Connect (exit {evidence.get('probe_exit')}) → "
                f"{reconciled.get('decision')}",
                f"1 build upload at the local Apple service: {outputs.get('upload_id')}, build "
                f"{outputs.get('build_number')}, {outputs.get('apple_state')}",
            ],
        )
    finally:
        demo.restart(victim)  # if the scenario broke off before it did


def shard_records(demo: Demo, job_id: str, index: int, count: int) -> list[dict[str, Any]]:
    """A stage's shard records, in shard order: the job view shows the stage's own (its shards are
    not surfaces yet, docs/parallel-stages.md)."""
    dynamodb = client("dynamodb")
    return [
        from_attributes(
            dynamodb.get_item(
                TableName=demo.stack.table_name,
                Key={"pk": {"S": f"STAGES#{job_id}"}, "sk": {"S": shard_sk(index, shard)}},
                ConsistentRead=True,
            ).get("Item", {})
        )
        for shard in range(count)
    ]


def scenario_shards(demo: Demo) -> ScenarioResult:
    """build once, then test as three shards over the three ap-south Macs, each restoring build's
    products through the handoff and running its slice of the tests, once."""
    tag = "shards"
    shards = 3
    job_id = demo.run("ui-tests", random_commit())
    demo.say(tag, f"ui-tests run → job {job_id}")
    job = demo.watch(tag, job_id)
    expect(job["status"] == "succeeded", f"job ended {job['status']}: {job.get('error')}")
    build = stage(job, "build")
    handed = build.get("handoff") or {}
    records = shard_records(demo, job_id, 1, shards)
    runs = [
        line.split()
        for line in (demo.shared / "ui-tests.runs").read_text().splitlines()
        if line.startswith(f"{job_id}:")
    ]
    evidence = [
        f"build on {build['agent_id']}: {handed.get('files')} files, {handed.get('bytes')} bytes handed on"
    ]
    for shard, record in enumerate(records):
        restored = record.get("restored") or {}
        tests = next((len(run) - 1 for run in runs if run[0] == f"{job_id}:test#shard-{shard}"), 0)
        line = (
            f"shard {shard} on {record.get('agent_id')}: attempt {record.get('attempt')}, "
            f"{record.get('status')}; restored "
            f"{restored.get('restored_bytes')} bytes, products "
            f"{'the same' if restored.get('digest') == handed.get('digest') else 'DIFFERENT'}; "
            f"{tests} tests"
        )
        demo.say(tag, line)
        evidence.append(line)
    expect(
        [(r.get("status"), r.get("attempt")) for r in records] == [("succeeded", 1)] * shards,
        f"shards {[(r.get('status'), r.get('attempt')) for r in records]}",
    )
    macs = {str(r.get("agent_id")) for r in records}
    expect(
        macs == set(FLEET["ap-south"]),
        f"the shards ran on {sorted(macs)}, not one on each of {FLEET['ap-south']}",
    )
    expect(
        all((r.get("restored") or {}).get("digest") == handed.get("digest") for r in records),
        "a shard restored other products than build's",
    )
    expect(
        all(
            (r.get("restored") or {}).get("restored_bytes", 0) > 0
            for r in records
            if r.get("agent_id") != build["agent_id"]
        ),
        "a shard on another Mac than build's downloaded nothing",
    )
    ran = sorted(test for run in runs for test in run[1:])
    expect(
        len(runs) == shards and len(ran) == 12 and len(set(ran)) == 12,
        f"{len(runs)} shard runs ran {len(ran)} tests ({len(set(ran))} distinct)",
    )
    evidence.append(f"{len(ran)} tests in all, each once, over {len(macs)} Macs")
    return ScenarioResult("build handed to 3 test shards on 3 Macs", True, evidence)
