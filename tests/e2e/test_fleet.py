"""Running a fleet with real relevo-agent processes on `relevo local up` (issue 20). Pause, drain and
the region's dispatch pause, driven through the `relevo agents` CLI: a paused agent finishes the
stage it runs and takes nothing new, the waiting stage goes to another online agent; a drained
agent exits once idle and, restarted as launchd would, stays paused until resumed; a paused
region's agents take nothing until its dispatch resumes. Capabilities: a stage that requires
`xcode: 16.*` waits as no_matching_agent while only a Linux agent is online (which passes it on,
never to the redrive DLQ), then runs on the Mac agent that starts (its `xcode-select`,
`xcodebuild` and `sw_vers` are doubles printing recorded outputs). Disk: an agent below its
min_free_disk_gb claims nothing (agent_low_disk); the stage goes to one with room, which runs the
project's cleanup between stages and keeps only its last workspace. The worker's shared stack
(tests/e2e/conftest.py), one region affinity per test."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.files.stack import StackInfo
from relevo_core.store import agents
from relevo_local.processes import agent_process, random_commit, write_agent_config
from tests.helpers.stack import regions_of, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("e2e-fleet-pause")]

REGIONS = ("pause", "drain", "dispatch", "caps", "disk", "shared", "quota")
RECORDED = Path(__file__).parents[1] / "unit" / "fixtures" / "capabilities"
PRESENCE_SEC = 0.5
# Long enough to see that nothing is claimed: several presence intervals and polls.
HOLD_SEC = 4 * PRESENCE_SEC + 1


@pytest.fixture(scope="module")
def stack(shared_stack: tuple[StackInfo, Path]) -> Iterator[tuple[StackInfo, Path]]:
    with regions_of(shared_stack, REGIONS) as stack:
        yield stack


def _agent(
    running: ExitStack,
    tmp_path: Path,
    stack_file: Path,
    region: str,
    agent_id: str,
    capacity: int = 2,
    env: dict[str, str] | None = None,
    workspace_root: Path | None = None,
    **settings: int | float,
) -> Any:
    config = write_agent_config(
        tmp_path / f"{agent_id}.toml",
        stack_file,
        region,
        agent_id,
        capacity=capacity,
        poll_wait_sec=1,
        presence_interval_sec=PRESENCE_SEC,
        **settings,
    )
    if workspace_root is not None:  # several agents of one machine sharing it, as the default root is shared
        config.write_text(
            config.read_text().replace(str(tmp_path / f"{agent_id}-workspaces"), str(workspace_root))
        )
    return running.enter_context(agent_process(config, tmp_path / f"{agent_id}.log", env))


def _presence(info: StackInfo, region: str, agent_id: str) -> agents.AgentPresence | None:
    now = datetime.now(UTC)
    return next(
        (a for a in agents.online_agents(info.table_name, region, now) if a.agent_id == agent_id), None
    )


def _relevo(stack_file: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "relevo_cli.main", *args, "--stack-file", str(stack_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _project(
    api: RelevoApi, region: str, command: str, project: dict[str, Any] | None = None, **stage: Any
) -> str:
    project_id = f"{region}-{secrets.token_hex(3)}"
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": region,
            # No test here waits for a lease to lapse; a short one only fences a stage whose renewal
            # a loaded host delayed (CI's 2 cores saw a gated stage fenced and its Mac take the next job).
            "lease_ttl_sec": 60,
            "queue_timeout_sec": 240,
            "stages": [{"name": "build", "run": command, **stage}],
            **(project or {}),
        },
    )
    return project_id


def _run(api: RelevoApi, project_id: str) -> str:
    return api.run_project(project_id, {"ref": "main", "commit": random_commit()})["job_id"]


def _gated(gate: Path) -> str:
    """A stage that runs until the test creates `gate`."""
    return f'while [ ! -f "{gate}" ]; do sleep 0.1; done; echo built'


def _ended(api: RelevoApi, job_id: str) -> dict[str, Any]:
    return wait_until(
        lambda: (j := api.get_job(job_id))["status"] in ("succeeded", "failed", "canceled") and j,
        120,
        f"{job_id} ended",
    )


def _waits_as(api: RelevoApi, job_id: str, reason: str) -> dict[str, Any]:
    return wait_until(
        lambda: (j := api.get_job(job_id))["queue_reason"] == reason and j,
        30,
        f"{job_id} waiting as {reason}",
    )


def _stays_unclaimed(api: RelevoApi, job_id: str, reason: str) -> None:
    """Once dispatched, for HOLD_SEC: the stage stays dispatched (no agent took it), said as `reason`."""
    _waits_as(api, job_id, reason)
    deadline = time.monotonic() + HOLD_SEC
    while time.monotonic() < deadline:
        job = api.get_job(job_id)
        assert job["stages"][0]["status"] == "dispatched" and job["queue_reason"] == reason, job
        time.sleep(0.2)


def test_a_paused_agent_finishes_its_stage_takes_nothing_new_and_the_stage_goes_to_another(
    stack, tmp_path: Path
):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    gate = tmp_path / "go"
    with ExitStack() as running:
        _agent(running, tmp_path, stack_file, "pause", "pause-1")
        wait_until(lambda: _presence(info, "pause", "pause-1"), 60, "pause-1 online")
        first = _run(api, _project(api, "pause", _gated(gate)))
        wait_until(
            lambda: api.get_job(first)["stages"][0]["status"] == "running", 60, "pause-1 runs the first stage"
        )

        said = _relevo(stack_file, "agents", "pause", "pause-1", "--note", "Xcode update", "--timeout", "2h")
        assert "pause-1 (pause) paused until" in said and "Xcode update" in said, said
        wait_until(
            lambda: (p := _presence(info, "pause", "pause-1")) and p.not_claiming == "agent_paused",
            30,
            "pause-1 says paused",
        )
        listing = json.loads(_relevo(stack_file, "agents", "--json"))["pause"]
        assert (
            listing[0]["paused"]["note"] == "Xcode update" and listing[0]["paused"]["timeout_sec"] == 7200
        ), listing

        # pause-1 has a free slot (capacity 2), and takes nothing new while paused.
        second = _run(api, _project(api, "pause", "echo second"))
        _waits_as(api, second, "agent_paused")
        # The stage it ran finishes there, under its one lease: no retry, no second attempt.
        gate.touch()
        done = _ended(api, first)
        assert done["status"] == "succeeded" and done["stages"][0]["agent_id"] == "pause-1", done
        assert done["stages"][0]["attempt"] == 1 and done["stages"][0]["retry_count"] == 0, done["stages"][0]
        _stays_unclaimed(api, second, "agent_paused")

        # Another online agent of the region takes it.
        _agent(running, tmp_path, stack_file, "pause", "pause-2")
        taken = _ended(api, second)
        assert taken["status"] == "succeeded" and taken["stages"][0]["agent_id"] == "pause-2", taken

        said = _relevo(stack_file, "agents", "resume", "pause-1")
        assert "pause-1 (pause) resumed" in said, said
        wait_until(
            lambda: (p := _presence(info, "pause", "pause-1")) and p.not_claiming is None,
            30,
            "pause-1 claims again",
        )
    assert "pause until" in (tmp_path / "pause-1.log").read_text()


def test_a_drained_agent_exits_when_idle_and_restarts_paused(stack, tmp_path: Path):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    gate = tmp_path / "go"
    with ExitStack() as running:
        agent = _agent(running, tmp_path, stack_file, "drain", "drain-1")
        wait_until(lambda: _presence(info, "drain", "drain-1"), 60, "drain-1 online")
        job_id = _run(api, _project(api, "drain", _gated(gate)))
        wait_until(
            lambda: api.get_job(job_id)["stages"][0]["status"] == "running", 60, "drain-1 runs the stage"
        )

        _relevo(stack_file, "agents", "drain", "drain-1", "--note", "macOS update", "--timeout", "1h")
        wait_until(
            lambda: (p := _presence(info, "drain", "drain-1")) and p.not_claiming == "agent_paused",
            30,
            "drain-1 says paused",
        )
        # Not idle: it stays up while its stage runs.
        time.sleep(HOLD_SEC)
        assert agent.poll() is None, (tmp_path / "drain-1.log").read_text()[-2000:]

        gate.touch()
        assert _ended(api, job_id)["status"] == "succeeded"
        assert agent.wait(timeout=30) == 0
        assert "drained: no stage runs; exiting" in (tmp_path / "drain-1.log").read_text()

        # launchd starts it again (KeepAlive): it finds the drain already set, stays up, paused.
        again = _agent(running, tmp_path, stack_file, "drain", "drain-1")
        wait_until(
            lambda: (p := _presence(info, "drain", "drain-1")) and p.not_claiming == "agent_paused",
            60,
            "drain-1 back, paused",
        )
        next_job = _run(api, _project(api, "drain", "echo next"))
        _stays_unclaimed(api, next_job, "agent_paused")
        assert again.poll() is None

        _relevo(stack_file, "agents", "resume", "drain-1")
        done = _ended(api, next_job)
        assert done["status"] == "succeeded" and done["stages"][0]["agent_id"] == "drain-1", done


def test_a_paused_region_takes_nothing_until_its_dispatch_resumes(stack, tmp_path: Path):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    with ExitStack() as running:
        _agent(running, tmp_path, stack_file, "dispatch", "dispatch-1")
        wait_until(lambda: _presence(info, "dispatch", "dispatch-1"), 60, "dispatch-1 online")
        said = _relevo(
            stack_file, "agents", "pause-region", "dispatch", "--note", "network work", "--timeout", "30m"
        )
        assert "dispatch: dispatch paused until" in said, said
        wait_until(
            lambda: (p := _presence(info, "dispatch", "dispatch-1")) and p.not_claiming == "agent_paused",
            30,
            "dispatch-1 paused",
        )
        job_id = _run(api, _project(api, "dispatch", "echo hi"))
        _stays_unclaimed(api, job_id, "agent_paused")
        queue = api.queue()
        assert [p["region"] for p in queue["paused_regions"]] == ["dispatch"], queue["paused_regions"]

        _relevo(stack_file, "agents", "resume-region", "dispatch")
        assert _ended(api, job_id)["status"] == "succeeded"


def _mac_commands(bin_dir: Path) -> dict[str, str]:
    """A PATH whose sw_vers, xcode-select and xcodebuild print the recorded outputs of a Mac."""
    bin_dir.mkdir()
    for name, recorded in [
        ("sw_vers", "sw_vers-productVersion.txt"),
        ("xcode-select", "xcode-select-p.txt"),
        ("xcodebuild", "xcodebuild-version.txt"),
    ]:
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\ncat "{RECORDED / recorded}"\n')
        script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _work_dead_letters(info: StackInfo, region: str) -> int:
    from relevo_core.aws import client

    sqs = client("sqs")
    url = sqs.get_queue_url(QueueName=info.work_queues[region].rsplit("/", 1)[1] + "-dlq")["QueueUrl"]
    return int(
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"][
            "ApproximateNumberOfMessages"
        ]
    )


def test_a_stage_needing_xcode_16_waits_as_no_matching_agent_until_a_mac_with_it_starts(
    stack, tmp_path: Path
):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    recheck_sec = 2
    with ExitStack() as running:
        _agent(running, tmp_path, stack_file, "caps", "caps-linux", requirement_recheck_sec=recheck_sec)
        # The record read is the one the wait saw: online means written within 3 presence intervals
        # (1.5 s here), which a second read on a loaded host may already be past.
        linux = wait_until(lambda: _presence(info, "caps", "caps-linux"), 60, "caps-linux online")
        assert (
            linux.capabilities is not None
            and linux.capabilities.xcode is None
            and linux.capabilities.os == "linux"
        )

        job_id = _run(api, _project(api, "caps", "echo built on $(hostname)", requires={"xcode": "16.*"}))
        waiting = _waits_as(api, job_id, "no_matching_agent")
        assert (
            waiting["queue_detail"]
            == "no online agent meets requires {xcode: 16.*}; nearest: caps-linux has xcode none"
        ), waiting
        assert waiting["stages"][0]["requires"] == {"xcode": "16.*"}
        waited_from = time.monotonic()
        _stays_unclaimed(api, job_id, "no_matching_agent")

        _agent(running, tmp_path, stack_file, "caps", "caps-mac", env=_mac_commands(tmp_path / "mac-bin"))
        done = _ended(api, job_id)
        waited_sec = time.monotonic() - waited_from
        mac = wait_until(lambda: _presence(info, "caps", "caps-mac"), 30, "caps-mac online")
        assert mac is not None and (mac.capabilities.xcode, mac.capabilities.macos) == ("16.2", "15.2"), mac
    assert done["status"] == "succeeded" and done["stages"][0]["agent_id"] == "caps-mac", done
    assert done["stages"][0]["attempt"] == 1 and done["stages"][0]["retry_count"] == 0
    # The ping-pong: the Linux agent passed the message on about once per recheck interval while
    # nothing matched (plus the hand-overs once the Mac was online), and none reached the DLQ.
    passes = (tmp_path / "caps-linux.log").read_text().count("passed on ")
    print(f"caps-linux passed the stage on {passes} times in {waited_sec:.1f}s (recheck {recheck_sec}s)")
    assert 1 <= passes <= waited_sec / recheck_sec + 3, passes
    assert _work_dead_letters(info, "caps") == 0


def test_a_low_disk_agent_stops_claiming_and_one_with_room_cleans_up_between_stages(stack, tmp_path: Path):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    with ExitStack() as running:
        # No disk has this much free: the real probe puts the agent below its threshold.
        _agent(running, tmp_path, stack_file, "disk", "disk-full", min_free_disk_gb=10**7)
        wait_until(
            lambda: (p := _presence(info, "disk", "disk-full")) and p.not_claiming == "agent_low_disk",
            60,
            "disk-full low",
        )
        cleaned = tmp_path / "cleaned"
        first = _run(
            api, _project(api, "disk", "echo one", project={"workspace_cleanup": f'pwd >> "{cleaned}"'})
        )
        _stays_unclaimed(api, first, "agent_low_disk")

        _agent(running, tmp_path, stack_file, "disk", "disk-roomy", keep_workspaces=1)
        done = _ended(api, first)
        assert done["status"] == "succeeded" and done["stages"][0]["agent_id"] == "disk-roomy", done
        workspaces = tmp_path / "disk-roomy-workspaces"
        wait_until(lambda: cleaned.exists(), 30, "the cleanup ran between stages")
        assert cleaned.read_text().splitlines() == [str(workspaces / done["project"])]
        # A second project's job: its workspace is the one kept, the first one's is removed.
        second = _ended(api, _run(api, _project(api, "disk", "echo two")))
        assert second["stages"][0]["agent_id"] == "disk-roomy"
        wait_until(
            lambda: sorted(p.name for p in workspaces.iterdir() if not p.name.startswith("."))
            == [second["project"]],
            30,
            "only the last workspace kept",
        )
    assert "below min_free_disk_gb" in (tmp_path / "disk-full.log").read_text()


def test_retention_never_removes_a_workspace_another_agent_of_the_machine_runs_a_stage_in(
    stack, tmp_path: Path
):
    """Two agents of one Mac share its workspace root (the default one is the user's). One runs a
    long stage of project P; the other, keeping one workspace, runs project Q's stage and prunes
    while idle: P's workspace is older and beyond what it keeps, but the stage running in it holds
    its lock, so it stays, and the stage finds its files intact at its end."""
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    shared, gate = tmp_path / "shared-workspaces", tmp_path / "go"
    with ExitStack() as running:
        _agent(running, tmp_path, stack_file, "shared", "shared-long", capacity=1, workspace_root=shared)
        long_job = _run(
            api, _project(api, "shared", f"echo mine > marker; {_gated(gate)}; test -f marker && echo intact")
        )
        wait_until(
            lambda: api.get_job(long_job)["stages"][0]["status"] == "running",
            60,
            "shared-long runs P's stage",
        )
        _agent(
            running,
            tmp_path,
            stack_file,
            "shared",
            "shared-idle",
            capacity=1,
            workspace_root=shared,
            keep_workspaces=1,
        )
        short = _ended(api, _run(api, _project(api, "shared", "echo q")))
        assert short["status"] == "succeeded" and short["stages"][0]["agent_id"] == "shared-idle", short

        idle_log = tmp_path / "shared-idle.log"
        wait_until(
            lambda: "a stage of another agent uses it; kept" in idle_log.read_text(),
            30,
            "shared-idle pruned, keeping P's",
        )
        assert (shared / api.get_job(long_job)["project"] / "marker").is_file()
        gate.touch()
        done = _ended(api, long_job)
        assert done["status"] == "succeeded" and done["stages"][0]["agent_id"] == "shared-long", done
        assert "intact" in "".join(c["text"] for c in api.job_logs(long_job, from_seq=0, limit=100)["chunks"])


def test_a_stage_over_its_jobs_artifact_quota_fails_on_a_real_agent_with_nothing_uploaded(
    stack, tmp_path: Path
):
    """artifact.max_job_bytes with an agent process: the stage's files (5,000 bytes) would take the
    job past its bound (1,000), so the stage fails Relevo.Fatal.ArtifactQuota, is not retried, and
    nothing is stored or recorded."""
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    with ExitStack() as running:
        _agent(running, tmp_path, stack_file, "quota", "quota-1")
        project_id = _project(
            api,
            "quota",
            'head -c 5000 /dev/zero > "$RELEVO_ARTIFACT_DIR/app.ipa"',
            project={"artifact": {"max_job_bytes": 1000}},
        )
        done = _ended(api, _run(api, project_id))
    stage = done["stages"][0]
    assert (done["status"], stage["error_class"], stage["attempt"]) == (
        "failed",
        "Relevo.Fatal.ArtifactQuota",
        1,
    ), done
    assert done.get("artifacts", []) == [] and done.get("artifact_bytes", 0) == 0, done
