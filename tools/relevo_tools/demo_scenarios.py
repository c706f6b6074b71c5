"""The scenarios of `make demo` (see relevo_tools.demo), each on its own project so they run side
by side, and what they share: the demo's API client, its story log, and the checks that decide
whether a scenario held."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from rich.console import Console

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.commands.jobs import stage_words  # relevo job watch's words for a stage
from relevo_core.aws import client
from relevo_core.intake.webhooks.github import sign
from relevo_core.models.group import Group
from relevo_core.stackfile import StackInfo
from relevo_core.store import agents
from relevo_core.store.groups import put_group
from relevo_local.processes import random_commit
from relevo_local.recorder import Recorder

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = ROOT / "examples" / "demo"
# Piped or captured output (CI, a log file) gets a table-friendly width instead of rich's 80.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 140)

# Two agents in eu-west and us-east. us-east agents take two stages each, so the agent that should
# take a retry always has a free slot; eu-west agents take one, so the agent killed mid-upload runs
# nothing else. ap-south's three take one each: ui-tests' three shards run one a Mac.
FLEET = {
    "eu-west": ("mac-eu-1", "mac-eu-2"),
    "us-east": ("mac-us-1", "mac-us-2"),
    "ap-south": ("mac-ap-1", "mac-ap-2", "mac-ap-3"),
}
CAPACITY = {"eu-west": 1, "us-east": 2, "ap-south": 1}
# release-app's build and sign stages `require` these: the bundle travels from one Mac to the other.
LABELS = {"mac-eu-1": {"bay": "build"}, "mac-eu-2": {"bay": "sign"}}
# Short presence and hand-back intervals and a short long-poll keep the demo quick; nothing else
# is special-cased (see tests/e2e/test_agents_share_and_retry.py).
AGENT_SETTINGS: dict[str, int | float] = {
    "poll_wait_sec": 1,
    "presence_interval_sec": 2,
    "handoff_delay_sec": 1,
    "handoff_max_wait_sec": 60,
    "outbox_interval_sec": 0.5,
    # release-app's sign requires mac-eu-2; while it is busy (the kill scenario), look again soon.
    "requirement_recheck_sec": 2,
}
TERMINAL = ("succeeded", "failed", "canceled")
POLL_SEC = 1.0
TAG_STYLE = {
    "setup": "green",
    "fleet": "white",
    "release": "cyan",
    "retry": "magenta",
    "dlq": "yellow",
    "kill": "red",
    "shards": "blue",
}
_started = [time.monotonic()]


def restart_clock() -> None:
    _started[0] = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - _started[0]


def say(tag: str, message: str) -> None:
    """One line of the demo's story: seconds since the start, the scenario, what happened."""
    style = TAG_STYLE.get(tag, "white")
    console.print(f"[dim]{elapsed():6.1f}s[/dim] [{style}]{tag:<8}[/{style}] {message}", highlight=False)


class SerialApi(RelevoApi):
    """The demo's API client: one request at a time. The local API runs each function in warm
    processes and starts another one (a cold start) when all are busy, as Lambda scales out;
    four watchers polling side by side would make every function scale out for nothing."""

    lock = threading.Lock()

    def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        with self.lock:
            return super().request(method, path, body, params)


class NotHeld(Exception):
    """A scenario did not happen as expected; the message says what was seen instead."""


def expect(condition: Any, message: str) -> None:
    if not condition:
        raise NotHeld(message)


@dataclass
class ScenarioResult:
    scenario: str
    ok: bool
    evidence: list[str]


@dataclass
class Demo:
    stack: StackInfo
    stack_file: Path
    work: Path
    shared: Path  # RELEVO_DEMO_DIR of the stage commands: markers and effect files
    agents: dict[str, subprocess.Popen[bytes]]
    # Starts an agent of the fleet again, as launchd's KeepAlive would after it died.
    restart: Callable[[str], None] = lambda agent_id: None
    job_ids: list[str] = field(default_factory=list)  # every job the demo started, in order
    seen: dict[str, dict[str, tuple[Any, ...]]] = field(default_factory=dict)  # what watch() printed, per job
    stopping: threading.Event = field(default_factory=threading.Event)  # set on Ctrl-C: every wait gives up

    def pause(self) -> None:
        expect(not self.stopping.wait(POLL_SEC), "interrupted")

    def __post_init__(self) -> None:
        self.api = SerialApi.for_stack(self.stack)

    def say(self, tag: str, message: str) -> None:
        say(tag, message)

    def cli(self, tag: str, *args: str) -> str:
        """Run the real `relevo` CLI against the demo's stack and return what it printed."""
        command = [sys.executable, "-m", "relevo_cli.main", *args, "--stack-file", str(self.stack_file)]
        self.say(tag, f"$ relevo {shlex.join(args)}")
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        output = (done.stdout + done.stderr).strip()
        for line in output.splitlines():
            self.say(tag, f"  ⤷ {line}")
        expect(done.returncode == 0, f"`relevo {' '.join(args)}` exited {done.returncode}: {output}")
        return output

    def run(self, project_id: str, commit: str) -> str:
        return self.track(self.api.run_project(project_id, {"ref": "main", "commit": commit})["job_id"])

    def track(self, job_id: str) -> str:
        if job_id not in self.job_ids:
            self.job_ids.append(job_id)
        return job_id

    def watch(
        self,
        tag: str,
        job_id: str,
        until: Callable[[dict[str, Any]], bool] | None = None,
        timeout: float = 120,
    ) -> dict[str, Any]:
        """Follow a job, printing every change of its status and of its stages, until `until`
        holds (by default: the job ended)."""
        until = until or (lambda job: job["status"] in TERMINAL)
        seen = self.seen.setdefault(job_id, {})
        deadline = time.monotonic() + timeout
        while True:
            job = self.api.get_job(job_id)
            if seen.get("") != (job["status"],):
                seen[""] = (job["status"],)
                why = f" ({job['queue_reason']})" if job.get("queue_reason") else ""
                self.say(tag, f"job {job_id} [bold]{job['status']}[/bold]{why}")
            for stage in job["stages"]:
                state = (stage["status"], stage["attempt"], stage["agent_id"], len(stage["attempts_log"]))
                if seen.get(stage["name"]) != state and stage["status"] != "pending":
                    seen[stage["name"]] = state
                    self.say(tag, f"  stage {stage['name']} → {stage_words(stage)}")
            if until(job):
                return job
            expect(
                job["status"] not in TERMINAL,
                f"job {job_id} ended {job['status']} ({job.get('error')}) too early",
            )
            expect(time.monotonic() < deadline, f"job {job_id} still {job['status']} after {timeout:.0f}s")
            self.pause()


def push_payload(repo: str, ref: str, commit: str) -> bytes:
    return json.dumps(
        {
            "ref": ref,
            "before": "0" * 40,
            "after": commit,
            "created": True,
            "deleted": False,
            "forced": False,
            "repository": {"full_name": repo, "name": repo.split("/")[-1], "default_branch": "main"},
            "pusher": {"name": "release-bot"},
            "head_commit": {"id": commit, "message": "Release 1.4.0"},
        }
    ).encode()


def stage(job: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in job["stages"] if s["name"] == name)


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def seconds_between(start: str | None, end: str | None) -> float | None:
    """Seconds between two ISO timestamps of the job view; None when either is missing."""
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


# ------------------------------------------------------------------------------------ scenarios
FLEET_SCENARIO = f"{len(FLEET)} regions, every agent online"


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


def report_release_to(demo: Demo, forge: Recorder) -> None:
    """release-app reports its commit statuses to `forge` (a loopback recorder standing in for
    GitHub), and its group's Slack channel posts there too: tokens and the webhook URL in Secrets
    Manager, as on AWS."""
    stack, secretsmanager = demo.stack, client("secretsmanager")
    token_ref = f"relevo/{stack.stack_name}/_status/release-app"
    hook_ref = f"relevo/{stack.stack_name}/_notify/release/slack"
    secretsmanager.create_secret(Name=token_ref, SecretString="demo-token-" + secrets.token_hex(8))
    secretsmanager.create_secret(
        Name=hook_ref, SecretString=f"{forge.url}/services/DEMO/RELEASE/{secrets.token_hex(6)}"
    )
    # Groups are the stack admins' (PUT /groups); the demo's stack names none, so the group is
    # stored as `relevo group apply` stores it.
    group = Group.model_validate(
        {
            "name": "release",
            "channels": [{"kind": "slack", "webhook_secret_ref": hook_ref}],
            "events": ["job_waiting", "job_failed", "job_succeeded"],
        }
    )
    put_group(stack.table_name, group, "demo", datetime.now(UTC))
    project = demo.api.get_project("release-app")
    project.update(
        group="release", commit_status={"provider": "github", "token_ref": token_ref, "api_url": forge.url}
    )
    demo.api.put_project("release-app", project)


def slack_text(message: dict[str, Any]) -> list[str]:
    """A recorded Slack message as the channel shows it, roughly: header, facts, command, link."""
    shown = []
    for block in message.get("blocks", []):
        kind = block.get("type")
        if kind == "header":
            shown.append(f"# {block['text']['text']}")
        elif kind == "section" and "fields" in block:
            shown.append("  ".join(f["text"].replace("*", "").replace("\n", ": ") for f in block["fields"]))
        elif kind == "section":
            shown.append(block["text"]["text"].replace("*", ""))
        elif kind == "actions":
            shown += [f"[{e['text']['text']}] {e.get('url', '')}" for e in block["elements"]]
    return shown


def forge_evidence(forge: Recorder, commit: str) -> ScenarioResult:
    statuses = [r.json() for r in forge.received(f"/statuses/{commit}")]
    slack = [r.json() for r in forge.received("/services/DEMO/RELEASE/")]
    states = [f"{s['state']}: {s['description']}" for s in statuses]
    ok = (
        bool(statuses)
        and statuses[-1]["state"] == "success"
        and any("waiting for approval" in s["description"] for s in statuses)
    )
    ok = ok and any(m["text"].endswith("waits for approval") for m in slack)
    evidence = [f"commit status relevo/release-app → {state}" for state in states]
    waiting = next((m for m in slack if m["text"].endswith("waits for approval")), None)
    if waiting:
        evidence += ["Slack message, as posted:"] + [f"  {line}" for line in slack_text(waiting)]
    return ScenarioResult(
        "commit statuses and the Slack message (recorded)", ok, evidence or ["nothing was sent"]
    )


_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Release Bot",
    "GIT_AUTHOR_EMAIL": "release@acme.example",
    "GIT_COMMITTER_NAME": "Release Bot",
    "GIT_COMMITTER_EMAIL": "release@acme.example",
}


def release_repository(work: Path) -> tuple[Path, str]:
    """acme/release-app as a local repository (the origin its checkout fetches from): VERSION and
    a script the build packs as the app's executable. Returns (origin, the commit of main)."""
    origin, clone = work / "release-app.git", work / "release-app"
    env = {**os.environ, **_GIT_IDENTITY}

    def git(*args: str, cwd: Path = work) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "--bare", "--quiet", "-b", "main", str(origin))
    git("clone", "--quiet", str(origin), str(clone))
    (clone / "VERSION").write_text("1.4.0\n")
    (clone / "Sources").mkdir()
    (clone / "Sources" / "release-app.sh").write_text(
        '#!/bin/sh\necho "ReleaseApp $(cat "$(dirname "$0")/VERSION")"\n'
    )
    git("add", ".", cwd=clone)
    git("commit", "--quiet", "-m", "Release 1.4.0", cwd=clone)
    git("push", "--quiet", "origin", "HEAD:main", cwd=clone)
    return origin, git("rev-parse", "HEAD", cwd=clone)


def check_out_release_from(demo: Demo, origin: Path) -> None:
    """release-app's checkout.url is the demo's local repository (the YAML names a placeholder)."""
    project = demo.api.get_project("release-app")
    project["checkout"] = {**project["checkout"], "url": str(origin)}
    demo.api.put_project("release-app", project)


def handoff_evidence(job: dict[str, Any]) -> list[str]:
    """What travelled: the tree each side computed from its own disk, and the bytes each Mac moved."""
    build, sign, upload = stage(job, "build"), stage(job, "sign"), stage(job, "upload")
    handed = build.get("handoff") or {}
    evidence = [
        f"build on {build['agent_id']}: tree {build['outputs'].get('digest', '?')[:16]}…, {handed.get('files')} files, "
        f"{handed.get('symlinks')} symlinks, {handed.get('bytes')} bytes handed on",
        f"sign on {sign['agent_id']}: restored {(sign.get('handoff') or {}).get('restored_bytes')} bytes, tree "
        f"{sign['outputs'].get('digest', '?')[:16]}… {'(the same)' if sign['outputs'].get('digest') == build['outputs'].get('digest') else '(DIFFERENT)'}",
        f"upload on {upload['agent_id']}: restored {(upload.get('handoff') or {}).get('restored_bytes')} bytes (its files were on that Mac)",
    ]
    return evidence


def scenario_release(
    demo: Demo, secret: str, forge: Recorder | None = None, commit: str | None = None
) -> list[ScenarioResult]:
    """A signed push, its redelivery answered as a duplicate, four stages gated before deploy, the
    build handed from one Mac to the other."""
    tag = "release"
    commit = commit or random_commit()
    body = push_payload("acme/release-app", "refs/heads/main", commit)
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": secrets.token_hex(16),
        "X-Hub-Signature-256": sign(secret, body),
    }
    url = f"{demo.stack.api_url}/webhooks/github/release-app"
    with SerialApi.lock:
        first = requests.post(url, data=body, headers=headers, timeout=30)
    expect(first.status_code == 202, f"the signed push answered {first.status_code}: {first.text}")
    job_id = demo.track(first.json()["job_id"])
    delivery = headers["X-GitHub-Delivery"]
    demo.say(tag, f"signed push {commit[:12]} (delivery {delivery[:8]}…) → {first.status_code} job {job_id}")
    # GitHub redelivers what it believes failed: the same delivery is not a second job.
    with SerialApi.lock:
        again = requests.post(url, data=body, headers=headers, timeout=30)
    demo.say(tag, f"the same delivery again → {again.status_code} {again.text.strip()}")
    try:
        answer = again.json()
    except ValueError:
        answer = {}
    webhook = ScenarioResult(
        "signed webhook; same delivery → duplicate",
        again.status_code == 200 and answer.get("duplicate") is True and answer.get("job_id") == job_id,
        [f"push → 202 {job_id}", f"redelivery → {again.status_code} {json.dumps(answer)}"],
    )

    gate = ScenarioResult("4 stages, approval gate, approved from the CLI", False, [])
    relay = ScenarioResult("the build handed from one Mac to another, verified", False, [])
    try:
        job = demo.watch(tag, job_id, lambda j: j["status"] == "waiting", timeout=240)
        before = [s["status"] for s in job["stages"]]
        expect(
            before == ["succeeded", "succeeded", "succeeded", "pending"],
            f"at the gate the stages were {before}",
        )
        demo.say(tag, "waiting for approval before deploy (build, sign, upload done)")
        relay.evidence = handoff_evidence(job)
        for line in relay.evidence:
            demo.say(tag, line)
        built, signed, uploaded = stage(job, "build"), stage(job, "sign"), stage(job, "upload")
        relay.ok = (
            built["agent_id"] != signed["agent_id"]
            and bool(built["outputs"].get("digest"))
            and signed["outputs"].get("digest") == built["outputs"].get("digest")
            and (signed.get("handoff") or {}).get("restored_bytes", 0) > 0
            and (uploaded.get("handoff") or {}).get("restored_bytes") == 0
            and job["commit"] == commit
        )
        said = demo.cli(tag, "job", "approve", job_id, "--reason", "release 1.4.0 signed off by QA")
        job = demo.watch(tag, job_id, timeout=90)
        statuses = [s["status"] for s in job["stages"]]
        expect(statuses == ["succeeded"] * 4, f"job {job['status']}, stages {statuses}")
        gate.ok = True
        gate.evidence = [
            "build → sign → upload, then waiting before deploy",
            said.splitlines()[-1],
            "deploy on " + str(stage(job, "deploy")["agent_id"]) + "; 4/4 succeeded",
        ]
    except Exception as exc:  # noqa: BLE001 - reported as the gate's ✗ row
        gate.evidence = [f"{type(exc).__name__}: {exc}"]
    if forge is None:
        return [webhook, gate, relay]
    # The reporter reads the table's stream: its last report trails the job by a moment.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(
        r.json().get("state") == "success" for r in forge.received(f"/statuses/{commit}")
    ):
        time.sleep(0.5)
    return [webhook, gate, relay, forge_evidence(forge, commit)]


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
        "transient failure retried on another agent",
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
    """The agent running the upload is SIGKILLed after the upload landed; the lease expires and
    the other agent reconciles the attempt with the effect probe."""
    tag = "kill"
    runs, uploads = demo.shared / "store-upload.runs", demo.shared / "store-uploads"
    job_id = demo.run("store-upload", random_commit())
    demo.say(tag, f"store-upload run → job {job_id}")
    job = demo.watch(
        tag, job_id, lambda j: lines(uploads) != [] and stage(j, "upload")["status"] == "running"
    )
    victim = stage(job, "upload")["agent_id"]
    demo.agents[victim].kill()  # SIGKILL: no handler runs, nothing is reported
    demo.agents[victim].wait()
    try:
        killed_at = datetime.now(UTC).isoformat()
        demo.say(
            tag,
            f"[bold]SIGKILL {victim}[/bold] (pid {demo.agents[victim].pid}) mid-upload; the upload had landed",
        )
        job = demo.watch(tag, job_id, timeout=120)
        upload = stage(job, "upload")
        reconciled = upload.get("reconciled") or {}
        evidence = reconciled.get("evidence") or {}
        log = upload["attempts_log"]
        if reconciled:
            unchanged = evidence.get("precondition_before") == evidence.get("precondition_now")
            demo.say(
                tag,
                f"reconciliation by {reconciled.get('agent_id')} (attempt {reconciled.get('attempt')}): "
                f"[bold]{reconciled.get('decision')}[/bold] · probe exit {evidence.get('probe_exit')}, "
                f"output {str(evidence.get('probe_output', '')).strip()!r} · previous agent {evidence.get('previous_agent')} · "
                f"precondition {'unchanged' if unchanged else 'changed'}",
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
        expect(
            (reconciled.get("decision"), evidence.get("probe_exit")) == ("succeeded", 0),
            f"reconciliation {reconciled}",
        )
        expect(lines(runs) == ["1"], f"the upload command ran for attempts {lines(runs)}")
        expect(lines(uploads) == [f"{job_id}:upload"], f"uploads {lines(uploads)}")
        lapse = seconds_between(killed_at, log[0].get("at"))
        return ScenarioResult(
            "agent SIGKILLed mid-stage, stage reconciled",
            True,
            [
                f"{victim} killed during attempt 1 → {log[0]['error']}"
                + (f" {lapse:.1f}s later" if lapse is not None else ""),
                f"{upload['agent_id']} probed the upload (exit 0) → reconciled as succeeded",
                "not re-run: 1 run, 1 upload",
            ],
        )
    finally:
        # launchd's KeepAlive would start it again: the release's stages that require it can run.
        demo.restart(victim)
        demo.say(tag, f"{victim} started again (as launchd's KeepAlive would)")


def shard_records(demo: Demo, job_id: str, index: int, count: int) -> list[dict[str, Any]]:
    """A stage's shard records, in shard order: the job view shows the stage's own (its shards are
    not surfaces yet, docs/parallel-stages.md)."""
    from relevo_core.store.codec import from_attributes
    from relevo_core.store.keys import shard_sk

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
            f"shard {shard} on {record.get('agent_id')}: attempt {record.get('attempt')}, {record.get('status')}; restored "
            f"{restored.get('restored_bytes')} bytes, products {'the same' if restored.get('digest') == handed.get('digest') else 'DIFFERENT'}; "
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


def guarded(name: str, run: Callable[[], ScenarioResult | list[ScenarioResult]]) -> list[ScenarioResult]:
    """A scenario's outcome(s); a refusal or a broken expectation is a ✗ row, not a crash."""
    try:
        result = run()
    except NotHeld as exc:
        return [ScenarioResult(name, False, [str(exc)])]
    except Exception as exc:  # noqa: BLE001 - an error is this scenario's ✗ row, the others still report
        return [ScenarioResult(name, False, [f"{type(exc).__name__}: {exc}"])]
    return result if isinstance(result, list) else [result]
