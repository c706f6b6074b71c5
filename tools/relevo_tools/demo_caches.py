"""`make demo`'s cache scenario: a project's dependency cache (docs/caches.md) restored on another
Mac. examples/demo/dep-cache.yaml's stages run the project's dependency step (pip install of its
requirements.lock into the workspace's .venv, skipped when .venv already holds that lock) with a
cache of `.venv` keyed on the lock file. Job 1 runs it on the Mac labelled `deps: a`: a miss, the
wheels installed, the entry saved. Job 2 runs it on the Mac labelled `deps: b`: the entry restored
(a hit), the step has nothing to do. The labels, not timing or placement, put the jobs on two Macs,
so a placement that prefers the Mac holding the key cannot send job 2 back to job 1's Mac.

The wheels come from the package registry through pip once (`pip download` of the hash-pinned
lock into .venv/share/), so the stages install offline, as from a local package index."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from relevo_cli.job_view import cache_line
from relevo_local.npm_package import VENV_SHARE
from relevo_local.processes import random_commit
from relevo_tools.demo_harness import PROJECTS, Demo, ScenarioResult, expect, stage

PROJECT = "dep-cache"
SCENARIO = "dependency cache restored on another Mac"
LOCK = PROJECTS / "dep-cache" / "requirements.lock"
# The Mac that saves the entry, then the one that restores it (their labels: demo_harness.LABELS).
FIRST, SECOND = "deps-a", "deps-b"
_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Dep Bot",
    "GIT_AUTHOR_EMAIL": "deps@acme.example",
    "GIT_COMMITTER_NAME": "Dep Bot",
    "GIT_COMMITTER_EMAIL": "deps@acme.example",
}


def wheels(share: Path = VENV_SHARE) -> Path:
    """The lock's wheels, downloaded once by pip (each checked against its pinned sha256) into a
    directory named after the lock; a later call that finds it downloads nothing."""
    target = share / f"demo-wheels-{hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]}"
    if target.is_dir():
        return target
    share.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=share, prefix=f".{target.name}."))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
            + ["--dest", str(partial), "-r", str(LOCK)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pip download of {LOCK.name}'s wheels failed: {done.stderr.strip()}")
        partial.rename(target)
    except OSError:
        if not target.is_dir():  # not another process that downloaded them first
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def dep_cache_repository(work: Path) -> tuple[Path, str]:
    """acme/dep-cache as a local repository (the origin its checkout fetches from), holding the
    lock file. Returns (origin, the commit of main)."""
    origin, clone = work / "dep-cache.git", work / "dep-cache"
    env = {**os.environ, **_GIT_IDENTITY}

    def git(*args: str, cwd: Path = work) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "--bare", "--quiet", "-b", "main", str(origin))
    git("clone", "--quiet", str(origin), str(clone))
    shutil.copy(LOCK, clone / "requirements.lock")
    git("add", ".", cwd=clone)
    git("commit", "--quiet", "-m", "Pin the dependencies", cwd=clone)
    git("push", "--quiet", "origin", "HEAD:main", cwd=clone)
    return origin, git("rev-parse", "HEAD", cwd=clone)


def outcome(job: dict[str, Any], name: str) -> dict[str, Any]:
    """The venv cache's outcome on the job's one stage."""
    found: list[dict[str, Any]] = [c for c in stage(job, name).get("caches") or [] if c.get("name") == "venv"]
    expect(found, f"job {job['job_id']}: {name} recorded no outcome of the venv cache")
    return found[0]


def check_restored(saved: dict[str, Any], restored: dict[str, Any]) -> list[str]:
    """What the two jobs show, as `relevo job view` says it, and the cold and restored seconds;
    NotHeld unless job 1 missed and saved, and job 2 hit the same key on another Mac, downloaded
    its bytes and has the same tree, by the cache's digest and by the step's own from its disk."""
    first, second = stage(saved, FIRST), stage(restored, SECOND)
    cold, warm = outcome(saved, FIRST), outcome(restored, SECOND)
    lines = [
        f"job 1 on {first['agent_id']}: {cache_line(FIRST, cold)}",
        f"job 2 on {second['agent_id']}: {cache_line(SECOND, warm)}",
    ]
    expect(
        (cold["restore"], cold.get("save")) == ("miss", "saved"),
        f"job 1's venv cache: {cold['restore']}, {cold.get('save')} (a miss, then saved, expected)",
    )
    expect(warm["restore"] == "hit", f"job 2's venv cache: {warm['restore']}, not a hit: {lines[1]}")
    expect(warm["key"] == cold["key"], f"job 2 hit {warm['key']}, not the saved {cold['key']}")
    expect(
        first["agent_id"] and second["agent_id"] and first["agent_id"] != second["agent_id"],
        f"both jobs ran on {first['agent_id']}: the entry was not restored on another Mac",
    )
    expect(warm["downloaded_bytes"] > 0, f"job 2 on {second['agent_id']} downloaded nothing")
    expect(
        warm.get("digest") is not None and warm.get("digest") == cold.get("digest"),
        f"restored tree {warm.get('digest')} is not the saved {cold.get('digest')}",
    )
    on_disk = (first["outputs"].get("digest"), second["outputs"].get("digest"))
    expect(
        on_disk[0] is not None and on_disk[0] == on_disk[1],
        f".venv on {second['agent_id']} ({on_disk[1]}) is not the one saved on {first['agent_id']} "
        f"({on_disk[0]}), by each Mac's own digest",
    )
    cold_sec = cold["restore_seconds"] + float(first["outputs"].get("step_seconds", "nan"))
    warm_sec = warm["restore_seconds"] + float(second["outputs"].get("step_seconds", "nan"))
    lines.append(
        f"cold {cold_sec:.2f}s (miss + pip install) vs restored {warm_sec:.2f}s "
        f"(restore {warm['restore_seconds']:.2f}s + the step) = {cold_sec / warm_sec:.1f}x; "
        f".venv {str(on_disk[1])[:16]}… the same on both Macs"
    )
    return lines


def scenario_dep_cache(demo: Demo) -> ScenarioResult:
    tag = "caches"
    origin, commit = dep_cache_repository(demo.work)
    project = demo.api.get_project(PROJECT)
    demo.api.put_project(PROJECT, {**project, "checkout": {**project["checkout"], "url": str(origin)}})
    jobs = []
    for number, name in ((1, FIRST), (2, SECOND)):
        body = {"ref": "main", "commit": commit, "stages": [name], "request_id": random_commit()}
        job_id = demo.track(demo.api.run_project(PROJECT, body)["job_id"])
        demo.say(tag, f"{PROJECT} run {number} ({name}) → job {job_id}")
        job = demo.watch(tag, job_id, timeout=180)
        expect(job["status"] == "succeeded", f"job ended {job['status']}: {job.get('error')}")
        jobs.append(job)
    evidence = check_restored(*jobs)
    for line in evidence:
        demo.say(tag, line)
    return ScenarioResult(SCENARIO, True, evidence)
