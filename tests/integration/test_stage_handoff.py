"""What travels from stage to stage, by the real agent code (relevo_agent's Agent handling the
real stage messages in this process) on the local stack: the job's commit checked out on each
Mac, pinned by the first checkout even when the branch moves; files handed from one Mac to
another; values as RELEVO_OUT_<STAGE>_<KEY>, recorded as they are written; a reconcile's probe
asking about the previous attempt's values (RELEVO_PREVIOUS_OUT_<KEY>); the credentials of a
checkout seen by git only."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.store.codec import from_attributes
from tests.helpers.agents import agent_at, handle_received
from tests.helpers.stack import job_items, receive_stage, table_items, wait_for_execution, wait_until

pytestmark = pytest.mark.timeout(240)


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@e",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@e",
            "HOME": str(cwd),
            "PATH": "/usr/bin:/bin",
        },
    ).stdout.strip()


def _repository(tmp_path: Path) -> tuple[Path, Path]:
    """(a bare origin, a clone to commit and push from) with one commit on main."""
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    _git("init", "--bare", "--quiet", "-b", "main", str(origin), cwd=tmp_path)
    _git("clone", "--quiet", str(origin), str(work), cwd=tmp_path)
    (work / "VERSION").write_text("1.4.0\n")
    (work / "Makefile").write_text("build:\n\techo built\n")
    _git("add", ".", cwd=work)
    _git("commit", "--quiet", "-m", "1.4.0", cwd=work)
    _git("push", "--quiet", "origin", "HEAD:main", cwd=work)
    return origin, work


def _push(work: Path, version: str) -> str:
    (work / "VERSION").write_text(version + "\n")
    _git("commit", "--quiet", "-am", version, cwd=work)
    _git("push", "--quiet", "origin", "HEAD:main", cwd=work)
    return _git("rev-parse", "HEAD", cwd=work)


def _run_next(stack, agent: Agent, job_id: str) -> dict:
    task, receipt = receive_stage(stack, job_id, timeout=30)
    handle_received(
        agent,
        Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )
    return task


def _stages(stack, job_id: str) -> dict[str, dict]:
    items = [from_attributes(i) for i in job_items(stack, job_id)]
    return {item["stage_name"]: item for item in items if item["sk"].startswith("STAGE#")}


BUILD = (
    'echo "commit $RELEVO_COMMIT version $(cat VERSION)"; mkdir -p build/App.app; cp VERSION '
    "build/App.app/VERSION; "
    'printf "#!/bin/sh\\necho app\\n" > build/App.app/App; chmod 755 build/App.app/App; ln -s App '
    "build/App.app/Current; "
    'echo "version=$(cat VERSION | tr -d "\\n")" >> "$RELEVO_OUTPUT"; '
    'printf "notes<<END\\nfirst\\nsecond\\nEND\\n" >> "$RELEVO_OUTPUT"; '
    "git status --porcelain > build/status.txt; env > build/env.txt"
)
SIGN = (
    'test -x build/App.app/App && test "$(readlink build/App.app/Current)" = App && '
    'test "$(cat build/App.app/VERSION | tr -d "\\n")" = "$RELEVO_OUT_BUILD_VERSION" && '
    'echo "sign got $RELEVO_OUT_BUILD_VERSION at $RELEVO_COMMIT, notes $(echo "$RELEVO_OUT_BUILD_NOTES" | '
    'wc -l)"; '
    'echo "commit=$RELEVO_COMMIT" >> "$RELEVO_OUTPUT"; echo "tree=$(cat VERSION | tr -d "\\n")" >> '
    '"$RELEVO_OUTPUT"'
)


def test_a_three_stage_chain_on_two_macs_builds_the_jobs_commit_and_hands_on_files_and_values(
    local_stack, project_id, tmp_path
):
    # Given a project that checks out a repository and hands build's bundle and values on
    origin, work = _repository(tmp_path)
    first = _git("rev-parse", "HEAD", cwd=work)
    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 60,
            "queue_timeout_sec": 60,
            "checkout": {"url": str(origin), "timeout_sec": 60},
            "stages": [
                {"name": "build", "run": BUILD, "handoff": ["build/App.app"]},
                {"name": "sign", "run": SIGN},
                {
                    "name": "upload",
                    "run": 'test ! -e build/status.txt && test -d build/App.app && echo "upload '
                    '$RELEVO_OUT_SIGN_COMMIT"',
                },
            ],
        },
    )
    # When it runs from a ref only: build on Mac A, then the branch moves, then sign and upload on Mac B
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    mac_a, mac_b = agent_at(tmp_path, local_stack, "mac-a"), agent_at(tmp_path, local_stack, "mac-b")
    assert _run_next(local_stack, mac_a, job_id)["stage"] == "build"
    moved = _push(work, "1.5.0")
    assert moved != first
    assert _run_next(local_stack, mac_b, job_id)["stage"] == "sign"
    assert _run_next(local_stack, mac_b, job_id)["stage"] == "upload"

    # Then the job succeeded, every stage built the commit main had when the job's first checkout ran
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    job = api.get_job(job_id)
    assert (job["commit"], job["commit_source"]) == (first, "checkout")
    stages = {stage["name"]: stage for stage in job["stages"]}
    assert stages["sign"]["outputs"] == {"commit": first, "tree": "1.4.0"}
    # and the values went from build to sign, multi-line ones too
    assert stages["build"]["outputs"] == {"version": "1.4.0", "notes": "first\nsecond"}
    # and the files came back on Mac B (sign's checks passed), with what each side moved
    assert (stages["build"]["handoff"]["files"], stages["build"]["handoff"]["symlinks"]) == (2, 1)
    assert stages["sign"]["handoff"]["restored_bytes"] > 0
    assert stages["sign"]["handoff"]["restored_digest"] == stages["build"]["handoff"]["digest"]
    # upload ran on the same Mac as sign: what it restored was already there, nothing downloaded
    assert stages["upload"]["handoff"]["restored_bytes"] == 0
    # and nothing of build's workspace beyond its handoff reached upload (the checkout's clean)
    build_workspace = tmp_path / "mac-a" / project_id
    env = (build_workspace / "build" / "env.txt").read_text()
    assert f"RELEVO_COMMIT={first}" in env and "RELEVO_OUTPUT=" in env
    # The workspace is the job's clean checkout: nothing but the agent's own files untracked.
    assert (build_workspace / "build" / "status.txt").read_text().strip() == "?? build/"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "AWS_SESSION_TOKEN" not in env


def _served_repository(tmp_path: Path) -> Path:
    """A bare repository under a directory a GitHttpServer serves (as /app.git)."""
    root = tmp_path / "forge"
    root.mkdir()
    origin, _ = _repository(tmp_path)
    subprocess.run(["git", "clone", "--quiet", "--bare", str(origin), str(root / "app.git")], check=True)
    return root


def _checkout_project(
    api: RelevoApi, project_id: str, url: str, credentials_ref: str | None, run: str = "true", **extra
) -> None:
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 60,
            "queue_timeout_sec": 60,
            "checkout": {
                "url": url,
                "timeout_sec": 30,
                **({"credentials_ref": credentials_ref} if credentials_ref else {}),
            },
            "stages": [{"name": "build", "run": run}],
            "retry": {"backoff_base_sec": 0},
            **extra,
        },
    )


def test_credentials_of_a_checkout_reach_git_only(local_stack, project_id, tmp_path):
    """A token in Secrets Manager: git gets it from the askpass helper and the forge sees it; the
    stage's environment, its log, the workspace, its .git/config and every record never hold it."""
    from tests.helpers.git_http import GitHttpServer

    token = "ghp_" + secrets.token_hex(16)
    ref = f"relevo/{local_stack.stack_name}/_git/{project_id}/token"
    client("secretsmanager").create_secret(
        Name=ref, SecretString=json.dumps({"username": "x-access-token", "password": token})
    )
    api = RelevoApi.for_stack(local_stack)
    with GitHttpServer(_served_repository(tmp_path), "x-access-token", token) as forge:
        _checkout_project(
            api,
            project_id,
            f"{forge.url}/app.git",
            ref,
            run="env; cat .git/config; git config --list --show-origin; git log --oneline",
        )
        job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
        _run_next(local_stack, agent_at(tmp_path, local_stack, "mac-a"), job_id)
        assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
        # The forge was asked with the token (after git's first, anonymous try).
        assert any(
            token in __import__("base64").b64decode(h.split()[1]).decode() for h in forge.authorizations if h
        )
    everything = json.dumps(table_items(local_stack, ""))
    assert token not in everything  # no log chunk, no stage record
    assert "1.4.0" in everything  # the stage did print its checkout's log
    workspace = tmp_path / "mac-a" / project_id
    assert token not in (workspace / ".git" / "config").read_text()
    assert not any(
        token in p.read_text(errors="ignore")
        for p in (tmp_path / "mac-a").rglob("*")
        if p.is_file() and p.stat().st_size < 10**6
    )


def test_refused_credentials_fail_the_checkout_for_good_and_an_unreachable_remote_is_retried(
    local_stack, project_id, tmp_path
):
    from tests.helpers.git_http import GitHttpServer

    ref = f"relevo/{local_stack.stack_name}/_git/{project_id}/token"
    client("secretsmanager").create_secret(Name=ref, SecretString="ghp_revoked")
    api = RelevoApi.for_stack(local_stack)
    mac = agent_at(tmp_path, local_stack, "mac-a")
    with GitHttpServer(_served_repository(tmp_path), "x-access-token", "ghp_current") as forge:
        _checkout_project(api, project_id, f"{forge.url}/app.git", ref)
        refused = api.run_project(project_id, {"ref": "main"})["job_id"]
        _run_next(local_stack, mac, refused)
        assert wait_for_execution(local_stack, refused)["status"] == "FAILED"
    job = api.get_job(refused)
    assert job["error"] == "Relevo.Fatal.Checkout" and job["stages"][0]["attempt"] == 1, job
    assert "Authentication failed" in job["error_cause"] or "401" in job["error_cause"], job["error_cause"]
    assert "ghp_revoked" not in json.dumps(table_items(local_stack, ""))
    # A remote nothing listens on: network trouble, retried (then it runs out of attempts).
    other = f"{project_id}-down"
    _checkout_project(
        api,
        other,
        "http://127.0.0.1:9/app.git",
        None,
        retry={"backoff_base_sec": 0, "attempts": {"Relevo.Transient.ConnectionReset": 2}},
    )
    down = api.run_project(other, {"ref": "main"})["job_id"]
    for _ in range(2):
        _run_next(local_stack, mac, down)
    assert wait_for_execution(local_stack, down)["status"] == "FAILED"
    job = api.get_job(down)
    assert job["error"] == "Relevo.Transient.ConnectionReset" and job["stages"][0]["attempt"] == 2, job


def test_a_probe_asks_about_the_value_the_previous_attempt_recorded(local_stack, project_id, tmp_path):
    """A notarization stage records its submission id right after submitting; its Mac dies; the
    next attempt's probe asks about that id."""
    submitted = tmp_path / "submitted"
    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 60,
            "queue_timeout_sec": 60,
            "retry": {"backoff_base_sec": 0},
            "stages": [
                {
                    "name": "notarize",
                    # The submission is the effect; its id is recorded at once; then the agent is shut down.
                    "run": 'echo "submission_id=sub-$RELEVO_JOB_ID" >> "$RELEVO_OUTPUT"; echo '
                    f'"$RELEVO_OPERATION_ID sub-$RELEVO_JOB_ID" >> {submitted}; '
                    'if [ "$RELEVO_ATTEMPT" = 1 ]; then sleep 30; fi',
                    "effect_probe": f'grep -F "$RELEVO_PREVIOUS_OUT_SUBMISSION_ID" {submitted} || exit 1',
                    "exec_timeout_sec": 60,
                    "kill_grace_sec": 1,
                }
            ],
        },
    )
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    mac_a = agent_at(tmp_path, local_stack, "mac-a")
    import threading

    runner = threading.Thread(target=_run_next, args=(local_stack, mac_a, job_id), daemon=True)
    runner.start()
    # Once the value is on record, the agent is shut down mid-command (as a second SIGTERM does).
    wait_until(
        lambda: _stages(local_stack, job_id).get("notarize", {}).get("outputs", {}).get("submission_id"),
        30,
        "the submission id on record",
    )
    mac_a.stages.stop_all("shutdown")
    runner.join(timeout=30)
    task = _run_next(local_stack, agent_at(tmp_path, local_stack, "mac-b"), job_id)
    assert task["attempt"] == 2
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    stage = _stages(local_stack, job_id)["notarize"]
    assert stage["reconciled"]["decision"] == "succeeded", stage["reconciled"]
    assert f"sub-{job_id}" in stage["reconciled"]["evidence"]["probe_output"]
    # Submitted once: the probe found it, nothing ran again.
    assert submitted.read_text().count(f"sub-{job_id}") == 1
    assert stage["receipt"]["outputs"] == {"submission_id": f"sub-{job_id}"}


def test_a_checkout_of_a_commit_the_repository_does_not_have_fails_for_good(
    local_stack, project_id, tmp_path
):
    origin, _ = _repository(tmp_path)
    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 60,
            "queue_timeout_sec": 60,
            "checkout": {"url": str(origin), "timeout_sec": 60},
            "stages": [{"name": "build", "run": "echo never"}],
        },
    )
    job_id = api.run_project(
        project_id, {"ref": "main", "commit": "0123456789abcdef0123456789abcdef01234567"}
    )["job_id"]
    _run_next(local_stack, agent_at(tmp_path, local_stack, "mac-a"), job_id)
    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    job = api.get_job(job_id)
    assert job["error"] == "Relevo.Fatal.Checkout", job
    assert "0123456789abcdef" in job["error_cause"]


def test_a_rerun_whose_skipped_stages_handoff_is_gone_is_refused_when_asked_for(
    local_stack, project_id, tmp_path
):
    """Removed by artifact.max_total_bytes, or expired: refused at once (410 HANDOFF_EXPIRED),
    naming the stage and the date, and nothing is written; never a job that fails halfway."""
    from relevo_cli.api import ApiError

    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 60,
            "queue_timeout_sec": 60,
            "stages": [
                {"name": "build", "run": "mkdir -p out && echo app > out/app", "handoff": ["out"]},
                {"name": "sign", "run": "test -f out/app"},
            ],
        },
    )
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    mac = agent_at(tmp_path, local_stack, "mac-a")
    _run_next(local_stack, mac, job_id)
    _run_next(local_stack, mac, job_id)
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    table = local_stack.table_name
    records = [from_attributes(i) for i in table_items(local_stack, f"ARTIFACTS#{job_id}")]
    pack = next(r for r in records if "/packs/" in r["path"])
    jobs_before = len(api.list_jobs(project=project_id)["jobs"])

    # Removed by quota: the record says when.
    client("dynamodb").update_item(
        TableName=table,
        Key={"pk": {"S": pack["pk"]}, "sk": {"S": pack["sk"]}},
        UpdateExpression="SET removed_at = :at, removed_reason = :why",
        ExpressionAttributeValues={
            ":at": {"S": "2026-12-01T04:00:00+00:00"},
            ":why": {"S": "artifact.max_total_bytes"},
        },
    )
    with pytest.raises(ApiError) as refused:
        api.rerun_job(job_id, "sign")
    assert (refused.value.status, refused.value.code) == (410, "HANDOFF_EXPIRED")
    assert "stage build" in str(refused.value) and "2026-12-01T04:00:00" in str(refused.value)

    # Expired: the manifest is gone from the bucket.
    client("dynamodb").update_item(
        TableName=table,
        Key={"pk": {"S": pack["pk"]}, "sk": {"S": pack["sk"]}},
        UpdateExpression="REMOVE removed_at, removed_reason",
    )
    manifest = api.get_job(job_id)["stages"][0]["handoff"]["manifest"]
    bucket, key = manifest.removeprefix("s3://").split("/", 1)
    client("s3").delete_object(Bucket=bucket, Key=key)
    with pytest.raises(ApiError) as expired:
        api.rerun_job(job_id, "sign")
    assert (
        expired.value.code == "HANDOFF_EXPIRED"
        and "have expired" in str(expired.value)
        and "stage build" in str(expired.value)
    )
    # Nothing was written: no job of the refused reruns.
    assert len(api.list_jobs(project=project_id)["jobs"]) == jobs_before
    # A rerun from build itself needs nothing stored.
    assert api.rerun_job(job_id, "build")["job_id"]


def test_a_handed_on_object_gone_before_the_next_stage_fails_it_as_gone_under_the_job_credentials(
    local_stack, project_id, tmp_path
):
    """The agent restores with its job's credentials (JobRole), which may list the bucket under the
    job's and its lineage's prefixes only: S3 answers their missing object 404, where it answers
    403 to a caller that may not list (Amazon S3 API Reference, GetObject, "Permissions"). So an
    object gone is Relevo.Fatal.HandoffGone, as docs/handoff.md says, not Relevo.Fatal.Client4xx."""
    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 60,
            "queue_timeout_sec": 60,
            "stages": [
                {"name": "build", "run": "mkdir -p out && echo app > out/app", "handoff": ["out"]},
                {"name": "sign", "run": "test -f out/app"},
            ],
        },
    )
    # Given build handed out/ on from one Mac
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    _run_next(local_stack, agent_at(tmp_path, local_stack, "mac-a"), job_id)
    assert _stages(local_stack, job_id)["build"]["status"] == "succeeded"
    # and its stored pack is gone since (expired, or removed by artifact.max_total_bytes)
    records = [from_attributes(i) for i in table_items(local_stack, f"ARTIFACTS#{job_id}")]
    pack = next(r for r in records if "/packs/" in r["path"])
    bucket, key = pack["uri"].removeprefix("s3://").split("/", 1)
    client("s3").delete_object(Bucket=bucket, Key=key)

    # When another Mac, with nothing in its workspace, runs sign
    _run_next(local_stack, agent_at(tmp_path, local_stack, "mac-b"), job_id)

    # Then sign fails for good as a handoff gone, naming the object
    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    job = api.get_job(job_id)
    assert job["error"] == "Relevo.Fatal.HandoffGone", job
    assert "is no longer stored" in job["error_cause"] and key in job["error_cause"]
