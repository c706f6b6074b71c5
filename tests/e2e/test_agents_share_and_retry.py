"""Agent presence and retry placement with real relevo-agent processes on `relevo local up`:
two agents of a region share work within their capacity, a transient failure is retried on the
other agent, and with one agent online the retry falls back to it. The worker's shared stack
(tests/e2e/conftest.py), one region affinity per test, so the agents of one test never see the
work of another."""

from __future__ import annotations

import secrets
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from relevo_cli.api import RelevoApi
from relevo_core.files.stack import StackInfo
from relevo_core.store import agents
from relevo_core.store.codec import from_attributes
from relevo_local.processes import agent_process, random_commit, write_agent_config
from tests.helpers.stack import job_items, regions_of, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("e2e-agents-share-and-retry"),
]

REGIONS = ("share", "retry", "solo")
# Short presence and hand-back intervals keep the module fast; nothing else is special-cased.
AGENT_SETTINGS = {"presence_interval_sec": 1, "handoff_delay_sec": 1, "handoff_max_wait_sec": 120}
# Fails with EX_TEMPFAIL (transient) on its first attempt only.
FLAKY_ONCE = 'if [ "$RELEVO_ATTEMPT" = 1 ]; then echo "flaky network"; exit 75; fi; echo ok'


@pytest.fixture(scope="module")
def stack(shared_stack: tuple[StackInfo, Path]) -> Iterator[tuple[StackInfo, Path]]:
    with regions_of(shared_stack, REGIONS) as stack:
        yield stack


def _agents(
    exit_stack: ExitStack, tmp_path: Path, stack_file: Path, region: str, *agent_ids: str
) -> dict[str, Any]:
    processes = {}
    for agent_id in agent_ids:
        config = write_agent_config(
            tmp_path / f"{agent_id}.toml",
            stack_file,
            region,
            agent_id,
            capacity=1,
            poll_wait_sec=1,
            **AGENT_SETTINGS,
        )
        processes[agent_id] = exit_stack.enter_context(agent_process(config, tmp_path / f"{agent_id}.log"))
    return processes


def _online(info: StackInfo, region: str, *agent_ids: str) -> None:
    wait_until(
        lambda: {a.agent_id for a in agents.online_agents(info.table_name, region, datetime.now(UTC))}
        >= set(agent_ids),
        60,
        f"{agent_ids} online in {region}",
    )


def _project(api: RelevoApi, region: str, command: str, **extra: Any) -> str:
    project_id = f"{region}-{secrets.token_hex(3)}"
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": region,
            # No test here waits for a lease to lapse: a short one would only fence a stage whose
            # renewal a loaded host delayed, and add an attempt these tests count exactly.
            "lease_ttl_sec": 60,
            "queue_timeout_sec": 120,
            "stages": [{"name": "build", "run": command}],
            "retry": {"backoff_base_sec": 0},
            **extra,
        },
    )
    return project_id


def _run(api: RelevoApi, project_id: str) -> str:
    return api.run_project(project_id, {"ref": "main", "commit": random_commit()})["job_id"]


def _finished(api: RelevoApi, job_id: str, logs: list[Path]) -> dict[str, Any]:
    job = wait_until(
        lambda: (j := api.get_job(job_id))["status"] in ("succeeded", "failed", "canceled") and j,
        120,
        f"{job_id} ended",
    )
    assert job["status"] == "succeeded", (job, [log.read_text()[-2000:] for log in logs])
    return job


def _stage(info: StackInfo, job_id: str) -> dict[str, Any]:
    return next(from_attributes(i) for i in job_items(info, job_id) if i["sk"]["S"] == "STAGE#00")


def test_two_agents_of_a_region_share_work_within_their_capacity(stack, tmp_path: Path):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    with ExitStack() as running:
        _agents(running, tmp_path, stack_file, "share", "share-1", "share-2")
        _online(info, "share", "share-1", "share-2")
        # Three jobs of three projects (no project lock between them), two agents of capacity 1.
        jobs = [_run(api, _project(api, "share", "sleep 5; echo built")) for _ in range(3)]
        for job_id in jobs:
            _finished(api, job_id, [tmp_path / "share-1.log", tmp_path / "share-2.log"])

    spans = {job_id: _stage(info, job_id) for job_id in jobs}
    by_agent: dict[str, list[tuple[str, str]]] = {}
    for stage in spans.values():
        by_agent.setdefault(stage["agent_id"], []).append((stage["started_at"], stage["ended_at"]))
    # Both agents took work...
    assert set(by_agent) == {"share-1", "share-2"}, by_agent
    # ...never more than one stage at a time on an agent of capacity 1...
    for agent_id, intervals in by_agent.items():
        ordered = sorted(intervals)
        assert all(end <= next_start for (_, end), (next_start, _) in pairwise(ordered)), (
            agent_id,
            ordered,
        )
    # ...and the two agents ran stages at the same time.
    (a_start, a_end), (b_start, b_end) = by_agent["share-1"][0], by_agent["share-2"][0]
    assert a_start < b_end and b_start < a_end, by_agent


def test_a_transient_failure_is_retried_on_the_other_agent(stack, tmp_path: Path):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    logs = [tmp_path / "retry-1.log", tmp_path / "retry-2.log"]
    with ExitStack() as running:
        _agents(running, tmp_path, stack_file, "retry", "retry-1", "retry-2")
        _online(info, "retry", "retry-1", "retry-2")
        # One job after another: whichever agent fails attempt 1, attempt 2 runs on the other.
        # (Both agents poll, so without the placement rule each retry would land on either.)
        placements = []
        for _ in range(3):
            job_id = _run(api, _project(api, "retry", FLAKY_ONCE))
            _finished(api, job_id, logs)
            stage = _stage(info, job_id)
            [failed] = stage["attempts_log"]
            assert (failed["attempt"], failed["error"]) == (1, "Relevo.Transient.ExitCode")
            assert stage["attempt"] == 2
            placements.append((failed["agent"], stage["agent_id"]))

    assert all({first, second} == {"retry-1", "retry-2"} for first, second in placements), (
        placements,
        [log.read_text()[-3000:] for log in logs],
    )


def test_with_one_agent_online_the_retry_falls_back_to_it(stack, tmp_path: Path):
    info, stack_file = stack
    api = RelevoApi.for_stack(info)
    with ExitStack() as running:
        # solo-2 was here and stopped cleanly: offline at once, not after three missed intervals.
        leaving = _agents(running, tmp_path, stack_file, "solo", "solo-2")["solo-2"]
        _online(info, "solo", "solo-2")
        leaving.send_signal(signal.SIGTERM)
        assert leaving.wait(timeout=30) == 0
        [record] = agents.agents_in_region(info.table_name, "solo")
        assert (record.agent_id, record.online) == ("solo-2", False)

        # No agent online: the dispatched stage waits with queue reason agent_offline.
        job_id = _run(api, _project(api, "solo", FLAKY_ONCE))
        job = wait_until(
            lambda: (j := api.get_job(job_id))["stages"][0]["status"] == "dispatched" and j, 60, "dispatched"
        )
        assert job["queue_reason"] == "agent_offline"

        _agents(running, tmp_path, stack_file, "solo", "solo-1")
        _finished(api, job_id, [tmp_path / "solo-1.log"])

    stage = _stage(info, job_id)
    assert [(a["attempt"], a["agent"]) for a in stage["attempts_log"]] == [(1, "solo-1")]
    assert (stage["attempt"], stage["agent_id"]) == (2, "solo-1")
    # It ran its own retry because nobody else was online, not after waiting for the bound.
    assert f"left {job_id}/build attempt 2" not in (tmp_path / "solo-1.log").read_text()
