"""A stage with shards on real relevo-agent processes on `relevo local up`: four shards on four
agents of capacity 1, each shard run once, each on its own agent, the stage succeeding once all
four did; fail-fast stopping the siblings' commands; three shards on three agents handing on
files and values that a later stage gets, every shard's, exactly."""

from __future__ import annotations

import secrets
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest

from relevo_cli.api import RelevoApi
from relevo_local.processes import agent_process, local_workspace_root, random_commit, write_agent_config
from relevo_core.stackfile import StackInfo
from relevo_core.store import agents, keys
from relevo_core.store.codec import from_attributes
from tests.helpers.processes import is_dead
from tests.helpers.stack import job_items, regions_stack, wait_until
from tests.helpers.tree import tree_listing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.xdist_group("e2e-parallel-shards")]

REGION = "shards"
SHARDS = 4


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StackInfo, Path]]:
    with regions_stack(tmp_path_factory.mktemp("shards-stack"), (REGION,)) as stack:
        yield stack


def _project(api: RelevoApi, *stages: dict[str, Any]) -> str:
    project_id = f"{REGION}-{secrets.token_hex(3)}"
    api.put_project(project_id, {"repo": f"acme/{project_id}", "region_affinity": REGION, "lease_ttl_sec": 6, "queue_timeout_sec": 120,
                                 "stages": list(stages)})
    return project_id


def _agents_online(running: ExitStack, stack: tuple[StackInfo, Path], tmp_path: Path, agent_ids: list[str]) -> list[Path]:
    """relevo-agent processes of capacity 1, online in the region; their logs."""
    info, stack_file = stack
    logs = [tmp_path / f"{agent_id}.log" for agent_id in agent_ids]
    for agent_id, log in zip(agent_ids, logs):
        config = write_agent_config(tmp_path / f"{agent_id}.toml", stack_file, REGION, agent_id, capacity=1, poll_wait_sec=1,
                                    presence_interval_sec=1)
        running.enter_context(agent_process(config, log))
    wait_until(lambda: {a.agent_id for a in agents.online_agents(info.table_name, REGION, datetime.now(timezone.utc))} >= set(agent_ids),
               60, f"{agent_ids} online")
    return logs


def _ended(api: RelevoApi, project_id: str) -> tuple[str, dict[str, Any]]:
    """A job of the project, run to its end: its id and the job as the API shows it."""
    job_id = api.run_project(project_id, {"ref": "main", "commit": random_commit()})["job_id"]
    return job_id, wait_until(lambda: (j := api.get_job(job_id))["status"] in ("succeeded", "failed", "canceled") and j, 120, f"{job_id} ended")


def test_four_shards_on_four_agents_each_run_once(stack, tmp_path: Path):
    info, _ = stack
    api = RelevoApi.for_stack(info)
    started, runs = tmp_path / "started", tmp_path / "runs"
    started.mkdir()
    # Each shard says it started, then holds its agent until all four have: with capacity 1, no
    # agent can take a second shard, so the four run on four agents at once (bounded: 60 s).
    command = (f'echo "$RELEVO_SHARD_INDEX/$RELEVO_SHARD_COUNT" >> "{runs}"; touch "{started}/$RELEVO_SHARD_INDEX"; '
               f'for _ in $(seq 600); do [ "$(ls "{started}" | wc -l)" -ge {SHARDS} ] && exit 0; sleep 0.1; done; exit 1')
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


def test_fail_fast_kills_the_running_siblings_process_groups(stack, tmp_path: Path):
    """Three shards on three agents: shard 1 fails for good once all three run; the other two,
    which would run a minute, are stopped: their records end canceled, their agents log the
    stop, and their commands' processes are gone."""
    info, _ = stack
    api = RelevoApi.for_stack(info)
    started = tmp_path / "started"
    started.mkdir()
    command = (f'echo $$ > "{started}/$RELEVO_SHARD_INDEX"; '
               f'until [ "$(ls "{started}" | wc -l)" -ge 3 ]; do sleep 0.1; done; '
               f'if [ "$RELEVO_SHARD_INDEX" = 1 ]; then echo "signing certificate expired"; exit 1; fi; '
               f'for _ in $(seq 600); do sleep 0.1; done; touch "{tmp_path}/finished-$RELEVO_SHARD_INDEX"')
    project_id = _project(api, {"name": "test", "run": command, "parallel": 3})
    with ExitStack() as running:
        logs = _agents_online(running, stack, tmp_path, [f"ff-mac-{n}" for n in range(3)])
        job_id, job = _ended(api, project_id)
        pids = [int((started / str(shard)).read_text()) for shard in (0, 2)]
        # The siblings' agents see their records canceled at their next renewal (every 2 s for a
        # 6 s lease) and kill the process groups.
        wait_until(lambda: all(is_dead(pid) for pid in pids), 15, "the siblings' commands stopped")

    assert job["status"] == "failed", (job, [log.read_text()[-2000:] for log in logs])
    records = {item["sk"]["S"]: from_attributes(item) for item in job_items(info, job_id)}
    assert [records[keys.shard_sk(0, shard)]["status"] for shard in range(3)] == ["canceled", "failed", "canceled"]
    assert sum("a sibling shard failed); stopping the stage" in log.read_text() for log in logs) == 2
    assert not list(tmp_path.glob("finished-*"))


# Build hands on a tool and its id; each shard checks it got them, then hands on results/<k>/: a
# file of random bytes (shard 2's over the 8 MiB that makes it a blob of its own, the others'
# packed) with its own mode and mtime, a link to it, and the file's sha256 as a value. Report
# checks every shard's file against that shard's value.
BUILD = ('set -e; mkdir -p build; printf "#!/bin/sh\\necho tool\\n" > build/tool; chmod 755 build/tool; '
         'echo "$RELEVO_JOB_ID" > build/id; echo "id=$RELEVO_JOB_ID" >> "$RELEVO_OUTPUT"')
SHARD = ('set -e; k=$RELEVO_SHARD_INDEX; test -x build/tool; test "$(cat build/id)" = "$RELEVO_OUT_BUILD_ID"; '
         'mkdir -p "results/$k"; if [ "$k" = 2 ]; then size=9437184; else size=300000; fi; '
         'head -c "$size" /dev/urandom > "results/$k/data.bin"; chmod 640 "results/$k/data.bin"; '
         'touch -t "20210304050$k.06" "results/$k/data.bin"; ln -s data.bin "results/$k/latest"; '
         'echo "sha=$(sha256sum "results/$k/data.bin" | cut -d" " -f1)" >> "$RELEVO_OUTPUT"; '
         # Hold this agent until all three started: three shards on three Macs.
         'touch "{started}/$k"; for _ in $(seq 600); do [ "$(ls "{started}" | wc -l)" -ge 3 ] && exit 0; sleep 0.1; done; exit 1')
REPORT = ('set -e; for k in 0 1 2; do eval want=\\$RELEVO_OUT_TEST_SHARD${{k}}_SHA; '
          'test "$(sha256sum "results/$k/data.bin" | cut -d" " -f1)" = "$want"; test "$(readlink "results/$k/latest")" = data.bin; done; '
          'env | grep ^RELEVO_OUT_ | sort > "{seen}"')


def test_a_later_stage_gets_every_shards_values_and_files_exactly(stack, tmp_path: Path):
    info, _ = stack
    api = RelevoApi.for_stack(info)
    started, seen = tmp_path / "started", tmp_path / "report.env"
    started.mkdir()
    project_id = _project(
        api, {"name": "build", "run": BUILD, "handoff": ["build/"]},
        {"name": "test", "parallel": 3, "run": SHARD.format(started=started), "handoff": ["results/"]},
        {"name": "report", "run": REPORT.format(seen=seen)},
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
    assert values == {"RELEVO_OUT_BUILD_ID": job_id, **{f"RELEVO_OUT_TEST_SHARD{k}_SHA": shards[k]["receipt"]["outputs"]["sha"] for k in range(3)}}
    # Build's files reached every shard, the tree build stored.
    assert {shard["restored"]["digest"] for shard in shards} == {records[keys.stage_sk(0)]["receipt"]["handoff"]["digest"]}
    # Every shard's files on report's Mac exactly as that shard left them on its own: bytes, modes,
    # mtimes, links; downloaded from the Macs that were not report's.
    report = records[keys.stage_sk(2)]
    report_workspace = local_workspace_root(tmp_path, report["agent_id"]) / project_id
    for k, shard in enumerate(shards):
        assert tree_listing(report_workspace, f"results/{k}") == tree_listing(local_workspace_root(tmp_path, shard["agent_id"]) / project_id, f"results/{k}")
    assert sorted(path.name for path in (report_workspace / "results").iterdir()) == ["0", "1", "2"]
    assert report["restored"]["from_stages"] == ["build", "test#shard-0", "test#shard-1", "test#shard-2"]
    assert report["restored"]["restored_bytes"] >= 300000
