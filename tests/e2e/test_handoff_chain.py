"""The handoff with two real relevo-agent processes on `relevo local up`, forced apart by labels:
build runs on Mac A, sign and upload on Mac B.

- The chain checks out a local git repository at the job's commit and hands on a tree with
  symlinks, executables, odd mtimes, an empty directory and a file over 100 MB; the far side's
  tree digest (computed by the stage itself, with tests/helpers/tree.py) equals the near side's,
  and build's values arrive as variables.
- A commit pushed to the branch while the job runs changes nothing later stages build.
- Nothing of an earlier job reaches a later one.
- A later stage on the same Mac restores 0 bytes.
- A rerun from sign on a wiped Mac B restores what it needs from the job it reruns.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.files.stack import StackInfo
from relevo_core.store import agents
from relevo_local.processes import agent_process, write_agent_config
from tests.helpers.stack import regions_of, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420), pytest.mark.xdist_group("e2e-handoff-chain")]

ROOT = Path(__file__).resolve().parents[2]
REGION = "relay"
BIG_BYTES = 105 * 1024 * 1024
SETTINGS = {
    "presence_interval_sec": 1,
    "handoff_delay_sec": 1,
    "poll_wait_sec": 1,
    "outbox_interval_sec": 0.5,
}
DIGEST = f'"$RELEVO_TEST_PYTHON" {ROOT}/tests/helpers/tree.py . build/App.app build/empty build/tools'

BUILD = f"""
set -e
echo "building $(cat VERSION) at $RELEVO_COMMIT"
while [ ! -f "$RELEVO_TEST_DIR/go-$RELEVO_JOB_ID" ]; do sleep 0.1; done
mkdir -p build/App.app/Frameworks/Kit.framework/Versions/A build/empty build/tools
printf '%s' "$RELEVO_JOB_ID" > build/App.app/BUILD_ID
cp VERSION build/App.app/VERSION
printf '#!/bin/sh\\necho app\\n' > build/App.app/App && chmod 755 build/App.app/App
head -c {BIG_BYTES} /dev/urandom > build/App.app/Assets.car
echo kit > build/App.app/Frameworks/Kit.framework/Versions/A/Kit
chmod 750 build/App.app/Frameworks/Kit.framework/Versions/A/Kit
ln -s A build/App.app/Frameworks/Kit.framework/Versions/Current
ln -s Versions/Current/Kit build/App.app/Frameworks/Kit.framework/Kit
printf '#!/bin/sh\\n' > build/tools/sign.sh && chmod 700 build/tools/sign.sh
touch -t 202001020304.05 build/App.app/VERSION build/tools/sign.sh
touch "build/leftover-$RELEVO_JOB_ID"
echo "digest=$({DIGEST})" >> "$RELEVO_OUTPUT"
echo "version=$(tr -d '\\n' < VERSION)" >> "$RELEVO_OUTPUT"
echo "build_id=$RELEVO_JOB_ID" >> "$RELEVO_OUTPUT"
"""
SIGN = f"""
set -e
test "$(cat build/App.app/BUILD_ID)" = "$RELEVO_OUT_BUILD_BUILD_ID"
test "$(tr -d '\\n' < VERSION)" = "$RELEVO_OUT_BUILD_VERSION"
test "$(ls build | grep -c leftover || true)" = 0
echo "digest=$({DIGEST})" >> "$RELEVO_OUTPUT"
echo "signed $RELEVO_OUT_BUILD_VERSION"
"""
UPLOAD = (
    'set -e; test -x build/App.app/App; echo "uploading $RELEVO_OUT_BUILD_VERSION signed '
    '$RELEVO_OUT_SIGN_DIGEST"'
)


def _git(*args: str, cwd: Path) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e",
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def _commit(work: Path, version: str) -> str:
    (work / "VERSION").write_text(version + "\n")
    _git("add", ".", cwd=work)
    _git("commit", "--quiet", "-m", version, cwd=work)
    _git("push", "--quiet", "origin", "HEAD:main", cwd=work)
    return _git("rev-parse", "HEAD", cwd=work)


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, shared_stack: tuple[StackInfo, Path]
) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("handoff-chain")
    origin, work = base / "origin.git", base / "work"
    _git("init", "--bare", "--quiet", "-b", "main", str(origin), cwd=base)
    _git("clone", "--quiet", str(origin), str(work), cwd=base)
    _commit(work, "1.4.0")
    signals = base / "signals"
    signals.mkdir()
    with regions_of(shared_stack, (REGION,)) as (info, stack_file), ExitStack() as running:
        env = {"RELEVO_TEST_PYTHON": sys.executable, "RELEVO_TEST_DIR": str(signals)}
        (base / "agents").mkdir()
        for agent_id, bay in (("mac-a", "a"), ("mac-b", "b")):
            config = write_agent_config(
                base / "agents" / f"{agent_id}.toml",
                stack_file,
                REGION,
                agent_id,
                capacity=1,
                labels={"bay": bay},
                **SETTINGS,
            )
            running.enter_context(agent_process(config, base / f"{agent_id}.log", env=env))
        wait_until(
            lambda: {a.agent_id for a in agents.online_agents(info.table_name, REGION, datetime.now(UTC))}
            >= {"mac-a", "mac-b"},
            60,
            "both agents online",
        )
        api = RelevoApi.for_stack(info)
        api.put_project(
            "relay-app",
            {
                "repo": "acme/relay-app",
                "region_affinity": REGION,
                "lease_ttl_sec": 20,
                "queue_timeout_sec": 120,
                "checkout": {"url": str(origin), "timeout_sec": 60},
                "stages": [
                    {
                        "name": "build",
                        "run": BUILD,
                        "requires": {"bay": "a"},
                        "exec_timeout_sec": 240,
                        "handoff": ["build/App.app", "build/empty", "build/tools"],
                    },
                    {"name": "sign", "run": SIGN, "requires": {"bay": "b"}, "exec_timeout_sec": 240},
                    {"name": "upload", "run": UPLOAD, "requires": {"bay": "b"}, "exec_timeout_sec": 120},
                ],
            },
        )
        yield {"info": info, "api": api, "work": work, "signals": signals, "base": base}


def _ended(api: RelevoApi, job_id: str, logs: list[Path]) -> dict[str, Any]:
    job = wait_until(
        lambda: (j := api.get_job(job_id))["status"] in ("succeeded", "failed", "canceled") and j,
        300,
        f"{job_id} ended",
    )
    assert job["status"] == "succeeded", (
        job.get("error"),
        job.get("error_cause"),
        [p.read_text()[-3000:] for p in logs],
    )
    return job


def test_a_chain_across_two_macs_hands_on_an_exact_tree_at_the_jobs_commit(fleet):
    api, work, signals, base = fleet["api"], fleet["work"], fleet["signals"], fleet["base"]
    logs = [base / "mac-a.log", base / "mac-b.log"]
    first = _git("rev-parse", "HEAD", cwd=work)
    job_id = api.run_project("relay-app", {"ref": "main"})["job_id"]
    # While build runs (it waits for the go file), the branch moves on: once its checkout has
    # recorded the job's commit. A stage is `running` from its claim, before its checkout, and on a
    # loaded host the branch could move first (the job would then rightly build the moved commit).
    wait_until(
        lambda: (j := api.get_job(job_id))["stages"][0]["status"] == "running" and j.get("commit"),
        120,
        "build running at its first checkout's commit",
    )
    moved = _commit(work, "9.9.9")
    (signals / f"go-{job_id}").touch()
    job = _ended(api, job_id, logs)
    stages = {stage["name"]: stage for stage in job["stages"]}

    # Forced apart: build on A, sign and upload on B.
    assert [stages[name]["agent_id"] for name in ("build", "sign", "upload")] == ["mac-a", "mac-b", "mac-b"]
    # The far side's tree (digest computed by the stage from its own disk) is the near side's.
    assert stages["sign"]["outputs"]["digest"] == stages["build"]["outputs"]["digest"]
    assert stages["sign"]["handoff"]["restored_digest"] == stages["build"]["handoff"]["digest"]
    # The job's commit is the one main had at the first checkout, not the one pushed meanwhile.
    assert job["commit"] == first != moved
    assert stages["build"]["outputs"]["version"] == "1.4.0"
    # Sign downloaded the whole tree (over 100 MB); upload, on the same Mac, downloaded nothing.
    assert stages["build"]["handoff"]["bytes"] > BIG_BYTES
    assert stages["sign"]["handoff"]["restored_bytes"] >= BIG_BYTES
    assert stages["upload"]["handoff"]["restored_bytes"] == 0

    # A second job: nothing of the first reaches it (sign checks its BUILD_ID and no leftover).
    second = api.run_project("relay-app", {"ref": "main", "request_id": "second"})["job_id"]
    wait_until(lambda: api.get_job(second)["stages"][0]["status"] == "running", 120, "second build running")
    (signals / f"go-{second}").touch()
    again = _ended(api, second, logs)
    assert again["commit"] == moved
    assert {s["name"]: s for s in again["stages"]}["build"]["outputs"]["version"] == "9.9.9"

    # A rerun of the first job from sign, on a wiped Mac B: restored from the first job's handoff.
    shutil.rmtree(base / "agents" / "mac-b-workspaces")
    rerun = api.rerun_job(job_id, "sign")["job_id"]
    rerun_job = _ended(api, rerun, logs)
    sign = {s["name"]: s for s in rerun_job["stages"]}["sign"]
    assert rerun_job["commit"] == first
    assert sign["status"] == "succeeded" and sign["handoff"]["restored_bytes"] >= BIG_BYTES
    assert sign["outputs"]["digest"] == stages["build"]["outputs"]["digest"]
