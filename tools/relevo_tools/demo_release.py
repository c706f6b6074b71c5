"""The release scenario of `make demo`: a signed GitHub push starts release-app, whose build hands
the app to sign on another Mac, waits at its approval gate, and reports its commit statuses and
its group's Slack messages to a loopback forge."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from relevo_core.aws import client
from relevo_core.intake.webhooks.github import sign
from relevo_core.models.group import Group
from relevo_core.store.groups import put_group
from relevo_local.apple.provision import LocalApple
from relevo_local.processes import random_commit
from relevo_local.recorder import Recorder
from relevo_tools.demo_harness import (
    Demo,
    ScenarioResult,
    SerialApi,
    expect,
    stage,
)


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


# store-upload's app at the local Apple service (release-app ships the one it starts with).
STORE_APP = ("com.acme.store-app", "Store App")


def add_apple_apps(apple: LocalApple) -> dict[str, str]:
    """Each Apple project's app at the local Apple service: project → app id. Two apps, so that
    the two projects' build numbers never meet."""
    return {"release-app": apple.app_id, "store-upload": apple.service.connect.add_app(*STORE_APP).id}


def use_local_apple(demo: Demo) -> None:
    """Each Apple project's team key stored where its release keys live
    (relevo/<stack>/_release/<project>/asc-key), and its effects pointed at that key and at its
    app at the local Apple service (the YAML names placeholders for both)."""
    assert demo.apple is not None
    for project_id, app_id in demo.apps.items():
        key = f"relevo/{demo.stack.stack_name}/_release/{project_id}/asc-key"
        demo.apple.store_key(client("secretsmanager"), key)
        project = demo.api.get_project(project_id)
        for declared in project["stages"]:
            effect = declared.get("effect")
            if effect and effect["kind"] in ("app_store_upload", "notarization"):
                effect["api_key"] = key
                if effect["kind"] == "app_store_upload":
                    effect["app_id"] = app_id
        demo.api.put_project(project_id, project)


def apple_uploads(demo: Demo, project_id: str) -> list[tuple[str, str, str, str]]:
    """The build uploads the local Apple service holds for a project's app: (id, version, build
    number, state), Apple's processing state once it made a build."""
    assert demo.apple is not None
    connect = demo.apple.service.connect
    with connect.lock:
        shown = []
        for upload in connect.uploads_of(demo.apps[project_id]):
            state: str = connect.upload_state(upload)
            if upload.build_id:
                state = connect.processing_state(connect.builds[upload.build_id])
            shown.append((upload.id, upload.short_version, upload.version, state))
        return shown


def apple_submissions(demo: Demo, job_id: str) -> list[tuple[str, str, str]]:
    """The notary submissions the local Apple service holds for a job: (id, name, status)."""
    assert demo.apple is not None
    notary = demo.apple.service.notary
    with notary.lock:
        found = [s for s in notary.submissions.values() if job_id in s.name]
    return [(s.id, s.name, notary.status(s)) for s in found]


def apple_evidence(demo: Demo, job: dict[str, Any]) -> ScenarioResult:
    """The release's upload and notarization, as the job shows them and as Apple holds them: one
    of each."""
    upload, notarize = stage(job, "upload"), stage(job, "notarize")
    shipped, notarized = upload["outputs"], notarize["outputs"]
    signed = shipped.get("sha256") == stage(job, "sign")["outputs"].get("ipa_sha256")
    uploads = [u for u in apple_uploads(demo, "release-app") if u[0] == shipped.get("upload_id")]
    everything = apple_uploads(demo, "release-app")
    submissions = apple_submissions(demo, job["job_id"])
    evidence = [
        f"upload {shipped.get('upload_id')}: ReleaseApp {shipped.get('build_version')} "
        f"({shipped.get('build_number')}), Apple's state {shipped.get('apple_state')}, "
        f"sha256 {str(shipped.get('sha256'))[:16]}… (sign's .ipa: "
        f"{'the same' if signed else 'DIFFERENT'})",
        f"notarization {notarized.get('submission_id')}: {notarized.get('apple_state')} "
        f"({notarized.get('submission_name')})",
        f"at the local Apple service: {len(everything)} build upload(s) of the app, "
        f"{len(submissions)} notary submission(s) of the job",
    ]
    ok = (
        len(everything) == 1
        and len(uploads) == 1
        and shipped.get("apple_state") == "VALID"
        and shipped.get("build_number") == str(job.get("build_number"))
        and signed
        and [(s[0], s[2]) for s in submissions] == [(notarized.get("submission_id"), "Accepted")]
        and notarized.get("apple_state") == "Accepted"
    )
    return ScenarioResult(
        "the .ipa uploaded and the .zip notarized, once each (app_store_upload, notarization)", ok, evidence
    )


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
    same = "(the same)" if sign["outputs"].get("digest") == build["outputs"].get("digest") else "(DIFFERENT)"
    evidence = [
        f"build on {build['agent_id']}: tree {build['outputs'].get('digest', '?')[:16]}…, "
        f"{handed.get('files')} files, "
        f"{handed.get('symlinks')} symlinks, {handed.get('bytes')} bytes handed on",
        f"sign on {sign['agent_id']}: restored {(sign.get('handoff') or {}).get('restored_bytes')} bytes, "
        "tree "
        f"{sign['outputs'].get('digest', '?')[:16]}… {same}",
        f"upload on {upload['agent_id']}: restored {(upload.get('handoff') or {}).get('restored_bytes')} "
        "bytes (its files were on that Mac)",
    ]
    return evidence


def scenario_release(
    demo: Demo, secret: str, forge: Recorder | None = None, commit: str | None = None
) -> list[ScenarioResult]:
    """A signed push, its redelivery answered as a duplicate, five stages gated before deploy, the
    build handed from one Mac to the other, uploaded to App Store Connect and notarized (the local
    Apple service) once each."""
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

    gate = ScenarioResult("5 stages, approval gate, approved from the CLI", False, [])
    relay = ScenarioResult("the build handed from one Mac to another, verified", False, [])
    results = [webhook, gate, relay]
    try:
        job = demo.watch(tag, job_id, lambda j: j["status"] == "waiting", timeout=240)
        before = [s["status"] for s in job["stages"]]
        expect(
            before == ["succeeded"] * 4 + ["pending"],
            f"at the gate the stages were {before}",
        )
        demo.say(tag, "waiting for approval before deploy (build, sign, upload, notarize done)")
        relay.evidence = handoff_evidence(job)
        for line in relay.evidence:
            demo.say(tag, line)
        if demo.apple is not None:
            shipped = apple_evidence(demo, job)
            results.append(shipped)
            for line in shipped.evidence:
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
        expect(statuses == ["succeeded"] * 5, f"job {job['status']}, stages {statuses}")
        gate.ok = True
        gate.evidence = [
            f"build {job.get('build_number')} → sign → upload → notarize, then waiting before deploy",
            said.splitlines()[-1],
            "deploy on " + str(stage(job, "deploy")["agent_id"]) + "; 5/5 succeeded",
        ]
    except Exception as exc:  # noqa: BLE001 - reported as the gate's ✗ row
        gate.evidence = [f"{type(exc).__name__}: {exc}"]
    if forge is None:
        return results
    # The reporter reads the table's stream: its last report trails the job by a moment.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(
        r.json().get("state") == "success" for r in forge.received(f"/statuses/{commit}")
    ):
        time.sleep(0.5)
    return [*results, forge_evidence(forge, commit)]
