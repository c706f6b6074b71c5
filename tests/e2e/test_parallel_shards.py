"""A stage with shards on real relevo-agent processes on `relevo local up`: four shards on four
agents of capacity 1, each shard run once, each on its own agent, the stage succeeding once all
four did; four shards spread two and two over two agents that could each take all four; a 2 × 2
matrix setting each shard's variables; fail-fast stopping the siblings' processes within the 5 s
bound (measured), `fail_fast: false` letting them finish; a shard's transient failure retried on
the other Mac; a shard's unknown outcome reconciled with its own probe; three shards on three
agents handing on files and values that a later stage gets, every shard's, exactly."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.files.stack import StackInfo
from relevo_core.store import agents, keys
from relevo_core.store.codec import from_attributes
from relevo_local.processes import agent_process, local_workspace_root, random_commit, write_agent_config
from tests.helpers.processes import is_dead
from tests.helpers.stack import job_items, regions_of, wait_until
from tests.helpers.tree import tree_listing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("e2e-parallel-shards")]

REGION = "shards"
SHARDS = 4


@pytest.fixture(scope="module")
def stack(shared_stack: tuple[StackInfo, Path]) -> Iterator[tuple[StackInfo, Path]]:
    with regions_of(shared_stack, (REGION,)) as stack:
        yield stack


def _project(
    api: RelevoApi,
    stage: dict[str, Any],
    lease_ttl_sec: int = 30,
    stages: Sequence[dict[str, Any]] = (),
    **settings: Any,
) -> str:
    """A project of `stage` (and `stages` after it) in the region. The lease is 30 s unless the
    test measures a stop: on a loaded host a claim's answer may take longer than a 6 s lease leaves
    it (the claim is then sent again or left to the lease, a second attempt the tests that count
    attempts would see), and a 12 s one saw a renewal starved past it (a full run on 2 cores: the
    stack's API answered in over 6 s, a held shard was fenced and its job failed)."""
    project_id = f"{REGION}-{secrets.token_hex(3)}"
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": REGION,
            "lease_ttl_sec": lease_ttl_sec,
            "queue_timeout_sec": 120,
            "stages": [stage, *stages],
            **settings,
        },
    )
    return project_id


def _agents_online(
    running: ExitStack, stack: tuple[StackInfo, Path], tmp_path: Path, agent_ids: list[str], capacity: int = 1
) -> list[Path]:
    """relevo-agent processes of `capacity`, online in the region; their logs."""
    info, stack_file = stack
    logs = [tmp_path / f"{agent_id}.log" for agent_id in agent_ids]
    for agent_id, log in zip(agent_ids, logs, strict=True):
        config = write_agent_config(
            tmp_path / f"{agent_id}.toml",
            stack_file,
            REGION,
            agent_id,
            capacity=capacity,
            poll_wait_sec=1,
            presence_interval_sec=1,
        )
        running.enter_context(agent_process(config, log))
    wait_until(
        lambda: {a.agent_id for a in agents.online_agents(info.table_name, REGION, datetime.now(UTC))}
        >= set(agent_ids),
        60,
        f"{agent_ids} online",
    )
    return logs


def _directory(path: Path) -> Path:
    """A directory the shards' commands mark what they did in (one file a shard)."""
    path.mkdir()
    return path


def _held_until_all_started(started: Path, count: int, first: str) -> str:
    """A shard's command: `first`, then it marks itself started and holds its slot until `count`
    shards have (bounded: 60 s, then it fails), so that they all run at once."""
    return (
        f'{first}; touch "{started}/$RELEVO_SHARD_INDEX"; '
        f'for _ in $(seq 600); do [ "$(ls "{started}" | wc -l)" -ge {count} ] && exit 0; sleep 0.1; done; '
        "exit 1"
    )


def _ended(api: RelevoApi, project_id: str) -> tuple[str, dict[str, Any]]:
    """A job of the project, run to its end: its id and the job as the API shows it."""
    job_id = api.run_project(project_id, {"ref": "main", "commit": random_commit()})["job_id"]
    return job_id, wait_until(
        lambda: (j := api.get_job(job_id))["status"] in ("succeeded", "failed", "canceled") and j,
        120,
        f"{job_id} ended",
    )


def test_four_shards_on_four_agents_each_run_once(stack, tmp_path: Path):
    info, _ = stack
    api = RelevoApi.for_stack(info)
    runs = tmp_path / "runs"
    # Each shard says it started, then holds its agent until all four have: with capacity 1, no
    # agent can take a second shard, so the four run on four agents at once.
    command = _held_until_all_started(
        _directory(tmp_path / "started"),
        SHARDS,
        f'echo "$RELEVO_SHARD_INDEX/$RELEVO_SHARD_COUNT" >> "{runs}"',
    )
    project_id = _project(api, {"name": "test", "run": command, "parallel": SHARDS})
    agent_ids = [f"shard-mac-{n}" for n in range(SHARDS)]
    with ExitStack() as running:
        logs = _agents_online(running, stack, tmp_path, agent_ids)
        job_id, job = _ended(api, project_id)

    assert job["status"] == "succeeded", (job, [log.read_text()[-2000:] for log in logs])
    assert sorted(runs.read_text().split()) == [f"{shard}/{SHARDS}" for shard in range(SHARDS)]
    records = {item["sk"]["S"]: from_attributes(item) for item in job_items(info, job_id)}
    shards = [records[keys.shard_sk(0, shard)] for shard in range(SHARDS)]
    assert [(shard["status"], shard["attempt"]) for shard in shards] == [("succeeded", 1)] * SHARDS
    assert sorted(shard["agent_id"] for shard in shards) == agent_ids


def test_fail_fast_kills_the_running_siblings_process_groups_within_5_s(stack, tmp_path: Path):
    """Three shards on three agents: shard 1 fails for good once all three run; the other two,
    which would run a minute, are stopped: their records end canceled, their agents log the
    stop, and their commands' processes are gone, within 5 s of the failing command's exit (the
    bound of issue 32: one renewal interval, min(lease / 3, 3 s) = 2 s for the 6 s lease, plus
    the kill grace, after the failure has reached the state machine). Each sibling notes when its
    SIGTERM came (a trap that exits), the failing shard when it exits: the figures are printed."""
    info, _ = stack
    api = RelevoApi.for_stack(info)
    started, stopped = _directory(tmp_path / "started"), _directory(tmp_path / "stopped")
    failed_at = tmp_path / "failed-at"
    command = (
        f"trap 'date +%s.%N > \"{stopped}/$RELEVO_SHARD_INDEX\"; exit 143' TERM; echo $$ > "
        f'"{started}/$RELEVO_SHARD_INDEX"; '
        f'until [ "$(ls "{started}" | wc -l)" -ge 3 ]; do sleep 0.1; done; '
        'if [ "$RELEVO_SHARD_INDEX" = 1 ]; then echo "signing certificate expired"; date +%s.%N > '
        f'"{failed_at}"; exit 1; fi; '
        f'for _ in $(seq 600); do sleep 0.1; done; touch "{tmp_path}/finished-$RELEVO_SHARD_INDEX"'
    )
    project_id = _project(
        api, {"name": "test", "run": command, "parallel": 3, "kill_grace_sec": 1}, lease_ttl_sec=6
    )
    with ExitStack() as running:
        logs = _agents_online(running, stack, tmp_path, [f"ff-mac-{n}" for n in range(3)])
        job_id, job = _ended(api, project_id)
        pids = [int((started / str(shard)).read_text()) for shard in (0, 2)]
        # The siblings' agents see their records canceled at their next renewal and kill the process groups.
        wait_until(lambda: all(is_dead(pid) for pid in pids), 15, "the siblings' commands stopped")

    assert job["status"] == "failed", (job, [log.read_text()[-2000:] for log in logs])
    records = {item["sk"]["S"]: from_attributes(item) for item in job_items(info, job_id)}
    shards = [records[keys.shard_sk(0, shard)] for shard in range(3)]
    assert [shard["status"] for shard in shards] == ["canceled", "failed", "canceled"]
    assert sum("a sibling shard failed); stopping the stage" in log.read_text() for log in logs) == 2
    assert not list(tmp_path.glob("finished-*"))
    failure = float(failed_at.read_text())
    closed = [datetime.fromisoformat(shards[shard]["closed_at"]).timestamp() - failure for shard in (0, 2)]
    stops = [float((stopped / str(shard)).read_text()) - failure for shard in (0, 2)]
    print(
        f"\nfail-fast stop: the failing command's exit to the siblings' records closed {closed[0]:.2f} s / "
        f"{closed[1]:.2f} s, "
        f"to their processes' SIGTERM (trap, then exit) {stops[0]:.2f} s / {stops[1]:.2f} s"
    )
    assert max(stops) <= 5.0, stops


def _shard_records(info: StackInfo, job_id: str, count: int) -> list[dict[str, Any]]:
    records = {item["sk"]["S"]: from_attributes(item) for item in job_items(info, job_id)}
    return [records[keys.shard_sk(0, shard)] for shard in range(count)]


def test_four_shards_after_a_build_spread_two_and_two_over_two_agents_that_could_each_take_all_four(
    stack, tmp_path: Path
):
    """A build, then four shards, on two agents of capacity 4 each. A next stage is offered to the
    Mac that ran the previous one while it has a free slot (its files are there), which would put
    all four shards on the build's Mac: shards are not, they spread, two and two (an agent
    holding more of the stage's shards leaves the next to the one holding fewer). The shards hold
    until all four started, so the spread is what placement made it, not what capacity forced;
    and the two shards on one Mac run in two workspaces."""
    info, _ = stack
    api = RelevoApi.for_stack(info)
    places = tmp_path / "places"
    command = _held_until_all_started(_directory(tmp_path / "started"), SHARDS, f'echo "$PWD" >> "{places}"')
    project_id = _project(
        api, {"name": "build", "run": "true"}, stages=[{"name": "test", "run": command, "parallel": SHARDS}]
    )
    agent_ids = ["spread-mac-a", "spread-mac-b"]
    with ExitStack() as running:
        logs = _agents_online(running, stack, tmp_path, agent_ids, capacity=SHARDS)
        job_id, job = _ended(api, project_id)

    assert job["status"] == "succeeded", (job, [log.read_text()[-2000:] for log in logs])
    records = {item["sk"]["S"]: from_attributes(item) for item in job_items(info, job_id)}
    shards = [records[keys.shard_sk(1, shard)] for shard in range(SHARDS)]
    assert [shard["status"] for shard in shards] == ["succeeded"] * SHARDS
    # Where placement put each shard: the Mac of its first attempt. (On a loaded host a claim's
    # answer may be lost; the attempt is then run again elsewhere, avoiding that Mac.)
    placed = [(shard.get("attempts_log") or [{"agent": shard["agent_id"]}])[0]["agent"] for shard in shards]
    assert sorted(placed.count(agent_id) for agent_id in agent_ids) == [2, 2], placed
    if all(shard["attempt"] == 1 for shard in shards):
        # Four shards running at once, two a Mac, in four workspaces (relevo_agent.admission). A
        # shard run again may start once its siblings ended, in a workspace one of them left.
        workspaces = places.read_text().split()
        assert len(set(workspaces)) == SHARDS, workspaces


def test_with_fewer_macs_than_shards_two_shards_share_a_mac_in_two_workspaces(stack, tmp_path: Path):
    """One agent of capacity 2 online, two shards: they share its slots (there is no other Mac to
    leave one to), run at once, each in a workspace of its own (the project's and `<project>.2`),
    never both in one tree."""
    info, _ = stack
    api = RelevoApi.for_stack(info)
    places = tmp_path / "places"
    command = _held_until_all_started(
        _directory(tmp_path / "started"), 2, f'echo "$RELEVO_SHARD_INDEX $PWD" >> "{places}"'
    )
    project_id = _project(api, {"name": "test", "run": command, "parallel": 2})
    with ExitStack() as running:
        [log] = _agents_online(running, stack, tmp_path, ["alone-mac"], capacity=2)
        job_id, job = _ended(api, project_id)

    assert job["status"] == "succeeded", (job, log.read_text()[-2000:])
    assert [shard["agent_id"] for shard in _shard_records(info, job_id, 2)] == ["alone-mac", "alone-mac"]
    workspaces = sorted(Path(line.split(" ", 1)[1]).name for line in places.read_text().splitlines())
    assert workspaces == [project_id, f"{project_id}.2"], workspaces
    assert "shards spread over the Macs" not in log.read_text()


def test_a_two_by_two_matrix_on_agent_processes_sets_each_shards_variables(stack, tmp_path: Path):
    info, _ = stack
    api = RelevoApi.for_stack(info)
    seen = tmp_path / "seen"
    command = (
        'echo "$RELEVO_SHARD_INDEX $RELEVO_SHARD_COUNT $RELEVO_MATRIX_DEVICE/$RELEVO_MATRIX_OS '
        f'$RELEVO_OPERATION_ID" >> "{seen}"'
    )
    project_id = _project(
        api,
        {
            "name": "test",
            "run": command,
            "matrix": {"device": ["iPhone-16", "iPad-Air"], "os": ["18.2", "17.5"]},
        },
    )
    with ExitStack() as running:
        logs = _agents_online(running, stack, tmp_path, ["matrix-mac-a", "matrix-mac-b"], capacity=2)
        job_id, job = _ended(api, project_id)

    assert job["status"] == "succeeded", (job, [log.read_text()[-2000:] for log in logs])
    # The first key varies slowest; each shard is an operation of its own.
    assert sorted(seen.read_text().splitlines()) == [
        f"0 4 iPhone-16/18.2 {job_id}:test#shard-0",
        f"1 4 iPhone-16/17.5 {job_id}:test#shard-1",
        f"2 4 iPad-Air/18.2 {job_id}:test#shard-2",
        f"3 4 iPad-Air/17.5 {job_id}:test#shard-3",
    ]
    assert [shard["status"] for shard in _shard_records(info, job_id, 4)] == ["succeeded"] * 4


def test_without_fail_fast_the_siblings_on_agent_processes_run_to_their_end_the_job_naming_the_shard(
    stack, tmp_path: Path
):
    """Shard 1 fails for good once all three run; shards 0 and 2 wait for that failure, then run
    on for longer than a renewal interval (3 s for the module's 30 s lease), and finish."""
    info, _ = stack
    api = RelevoApi.for_stack(info)
    started = _directory(tmp_path / "started")
    failed_marker = tmp_path / "shard-1-failed"
    command = (
        f'touch "{started}/$RELEVO_SHARD_INDEX"; '
        f'until [ "$(ls "{started}" | wc -l)" -ge 3 ]; do sleep 0.1; done; '
        f'if [ "$RELEVO_SHARD_INDEX" = 1 ]; then touch "{failed_marker}"; echo "signing certificate '
        'expired"; exit 1; fi; '
        f'until [ -e "{failed_marker}" ]; do sleep 0.1; done; sleep 5; touch '
        f'"{tmp_path}/finished-$RELEVO_SHARD_INDEX"'
    )
    project_id = _project(api, {"name": "test", "run": command, "parallel": 3, "fail_fast": False})
    with ExitStack() as running:
        logs = _agents_online(running, stack, tmp_path, [f"nff-mac-{n}" for n in range(3)])
        job_id, job = _ended(api, project_id)

    assert job["status"] == "failed", (job, [log.read_text()[-2000:] for log in logs])
    assert sorted(path.name for path in tmp_path.glob("finished-*")) == ["finished-0", "finished-2"]
    assert [shard["status"] for shard in _shard_records(info, job_id, 3)] == [
        "succeeded",
        "failed",
        "succeeded",
    ]
    assert not any("a sibling shard failed" in log.read_text() for log in logs)
    assert job["error"] == "Relevo.Fatal.ExitCode"
    # The stage's failure names its failed shards; each one's cause is on its own record.
    summary = json.loads(job["error_cause"])
    assert (summary["stage"], summary["failed_shards"], summary["error_class"]) == (
        "test",
        [1],
        "Relevo.Fatal.ExitCode",
    ), summary
    assert [entry["attempt"] for entry in job["stages"][0]["shards"][1]["attempts_log"]] == [1]


def test_a_shards_transient_failure_is_retried_on_the_other_mac(stack, tmp_path: Path):
    """Two shards on two agents of capacity 2: shard 0's first attempt exits 75 (transient); its
    retry, dispatched avoiding that agent, runs on the other one, beside shard 1."""
    info, _ = stack
    api = RelevoApi.for_stack(info)
    runs = tmp_path / "runs"
    release = tmp_path / "release"
    command = (
        f'echo "$RELEVO_SHARD_INDEX $RELEVO_ATTEMPT" >> "{runs}"; '
        f'if [ "$RELEVO_SHARD_INDEX" = 0 ] && [ "$RELEVO_ATTEMPT" = 1 ]; then exit 75; fi; '
        f'if [ "$RELEVO_SHARD_INDEX" = 1 ]; then until [ -e "{release}" ]; do sleep 0.1; done; fi; '
        f'if [ "$RELEVO_SHARD_INDEX" = 0 ]; then touch "{release}"; fi'
    )
    project_id = _project(api, {"name": "test", "run": command, "parallel": 2}, retry={"backoff_base_sec": 0})
    agent_ids = ["retry-mac-a", "retry-mac-b"]
    with ExitStack() as running:
        logs = _agents_online(running, stack, tmp_path, agent_ids, capacity=2)
        job_id, job = _ended(api, project_id)

    assert job["status"] == "succeeded", (job, [log.read_text()[-2000:] for log in logs])
    assert sorted(runs.read_text().splitlines()) == ["0 1", "0 2", "1 1"]
    first, second = _shard_records(info, job_id, 2)
    assert (first["attempt"], first["retry_count"], second["attempt"]) == (2, 1, 1)
    failed_on = first["attempts_log"][0]["agent"]
    assert first["failed_agents"] == [failed_on]
    assert first["agent_id"] == next(agent_id for agent_id in agent_ids if agent_id != failed_on)


def test_a_shards_unknown_outcome_is_reconciled_with_its_own_probe(stack, tmp_path: Path):
    """Two shards on two agents of capacity 1: shard 1 makes its effect (a line naming its
    operation), then its agent is SIGKILLed. Once the lease lapses the other agent, done with
    shard 0, takes shard 1's attempt 2: the stage's probe runs with shard 1's operation id, finds
    the effect, and shard 1 is reconciled succeeded without running again; shard 0 is untouched."""
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    effect, probes, started = tmp_path / "effect", tmp_path / "probes", tmp_path / "started-1"
    effect.touch()
    command = (
        f'if [ "$RELEVO_SHARD_INDEX" = 1 ]; then echo "$RELEVO_OPERATION_ID" >> "{effect}"; echo '
        f'"$RELEVO_ATTEMPT" >> "{started}"; '
        f"sleep 60; fi"
    )
    probe = f'echo "$RELEVO_OPERATION_ID" >> "{probes}"; grep -F "$RELEVO_OPERATION_ID" "{effect}"'
    project_id = _project(
        api,
        {"name": "test", "run": command, "parallel": 2, "effect_probe": probe, "kill_grace_sec": 1},
        lease_ttl_sec=6,
        retry={"backoff_base_sec": 0},
    )
    agent_ids = ["probe-mac-a", "probe-mac-b"]
    with ExitStack() as running:
        processes = {}
        for agent_id in agent_ids:
            config = write_agent_config(
                tmp_path / f"{agent_id}.toml",
                stack_file,
                REGION,
                agent_id,
                capacity=1,
                poll_wait_sec=1,
                presence_interval_sec=1,
            )
            processes[agent_id] = running.enter_context(agent_process(config, tmp_path / f"{agent_id}.log"))
        wait_until(
            lambda: {a.agent_id for a in agents.online_agents(info.table_name, REGION, datetime.now(UTC))}
            >= set(agent_ids),
            60,
            f"{agent_ids} online",
        )
        job_id = api.run_project(project_id, {"ref": "main", "commit": random_commit()})["job_id"]
        wait_until(lambda: started.exists() and started.read_text().strip(), 60, "shard 1 started")
        holder = _shard_records(info, job_id, 2)[1]["agent_id"]
        processes[
            holder
        ].kill()  # SIGKILL: the attempt's outcome is unknown to Relevo; its watchdog kills the command
        processes[holder].wait()
        job = wait_until(
            lambda: (j := api.get_job(job_id))["status"] in ("succeeded", "failed", "canceled") and j,
            120,
            f"{job_id} ended",
        )

    logs = [(tmp_path / f"{agent_id}.log").read_text()[-2000:] for agent_id in agent_ids]
    assert job["status"] == "succeeded", (job, logs)
    first, second = _shard_records(info, job_id, 2)
    assert (first["status"], first["attempt"], "reconciled" in first) == ("succeeded", 1, False)
    assert (second["status"], second["attempt"]) == ("succeeded", 2)
    assert second["reconciled"]["decision"] == "succeeded", second["reconciled"]
    assert second["reconciled"]["evidence"]["probe_exit"] == 0
    assert second["reconciled"]["evidence"]["previous_agent"] == holder
    # The probe saw shard 1's operation only, and the effect happened once.
    assert probes.read_text().split() == [f"{job_id}:test#shard-1"]
    assert effect.read_text().split() == [f"{job_id}:test#shard-1"]
    assert started.read_text().split() == ["1"]


# Build hands on a tool and its id; each shard checks it got them, then hands on results/<k>/: a
# file of random bytes (shard 2's over the 8 MiB that makes it a blob of its own, the others'
# packed) with its own mode and mtime, a link to it, and the file's sha256 as a value. Report
# checks every shard's file against that shard's value.
BUILD = (
    'set -e; mkdir -p build; printf "#!/bin/sh\\necho tool\\n" > build/tool; chmod 755 build/tool; '
    'echo "$RELEVO_JOB_ID" > build/id; echo "id=$RELEVO_JOB_ID" >> "$RELEVO_OUTPUT"'
)
SHARD = (
    'set -e; k=$RELEVO_SHARD_INDEX; test -x build/tool; test "$(cat build/id)" = "$RELEVO_OUT_BUILD_ID"; '
    'mkdir -p "results/$k"; if [ "$k" = 2 ]; then size=9437184; else size=300000; fi; '
    'head -c "$size" /dev/urandom > "results/$k/data.bin"; chmod 640 "results/$k/data.bin"; '
    'touch -t "20210304050$k.06" "results/$k/data.bin"; ln -s data.bin "results/$k/latest"; '
    'echo "sha=$(sha256sum "results/$k/data.bin" | cut -d" " -f1)" >> "$RELEVO_OUTPUT"; '
    # Hold this agent until all three started: three shards on three Macs.
    'touch "{started}/$k"; for _ in $(seq 600); do [ "$(ls "{started}" | wc -l)" -ge 3 ] && exit 0; sleep '
    "0.1; done; exit 1"
)
REPORT = (
    "set -e; for k in 0 1 2; do eval want=\\$RELEVO_OUT_TEST_SHARD${{k}}_SHA; "
    'test "$(sha256sum "results/$k/data.bin" | cut -d" " -f1)" = "$want"; test "$(readlink '
    '"results/$k/latest")" = data.bin; done; '
    'env | grep ^RELEVO_OUT_ | sort > "{seen}"'
)


def test_a_later_stage_gets_every_shards_values_and_files_exactly(stack, tmp_path: Path):
    info, _ = stack
    api = RelevoApi.for_stack(info)
    started, seen = tmp_path / "started", tmp_path / "report.env"
    started.mkdir()
    project_id = _project(
        api,
        {"name": "build", "run": BUILD, "handoff": ["build/"]},
        stages=[
            {"name": "test", "parallel": 3, "run": SHARD.format(started=started), "handoff": ["results/"]},
            {"name": "report", "run": REPORT.format(seen=seen)},
        ],
    )
    agent_ids = [f"relay-mac-{n}" for n in range(3)]
    with ExitStack() as running:
        logs = _agents_online(running, stack, tmp_path, agent_ids)
        job_id, job = _ended(api, project_id)

    assert job["status"] == "succeeded", (job, [log.read_text()[-3000:] for log in logs])
    records = {item["sk"]["S"]: from_attributes(item) for item in job_items(info, job_id)}
    shards = [records[keys.shard_sk(1, k)] for k in range(3)]
    assert sorted(shard["agent_id"] for shard in shards) == agent_ids
    # Every shard's value, under its index.
    values = dict(line.split("=", 1) for line in seen.read_text().splitlines())
    assert values == {
        "RELEVO_OUT_BUILD_ID": job_id,
        **{f"RELEVO_OUT_TEST_SHARD{k}_SHA": shards[k]["receipt"]["outputs"]["sha"] for k in range(3)},
    }
    # Build's files reached every shard, the tree build stored.
    assert {shard["restored"]["digest"] for shard in shards} == {
        records[keys.stage_sk(0)]["receipt"]["handoff"]["digest"]
    }
    # Every shard's files on report's Mac exactly as that shard left them on its own: bytes, modes,
    # mtimes, links; downloaded from the Macs that were not report's.
    report = records[keys.stage_sk(2)]
    report_workspace = local_workspace_root(tmp_path, report["agent_id"]) / project_id
    for k, shard in enumerate(shards):
        assert tree_listing(report_workspace, f"results/{k}") == tree_listing(
            local_workspace_root(tmp_path, shard["agent_id"]) / project_id, f"results/{k}"
        )
    assert sorted(path.name for path in (report_workspace / "results").iterdir()) == ["0", "1", "2"]
    assert report["restored"]["from_stages"] == ["build", "test#shard-0", "test#shard-1", "test#shard-2"]
    assert report["restored"]["restored_bytes"] >= 300000
