"""A stage's caches by the real agent code (relevo_agent's Agent handling the real stage messages
in this process) on the local stack, two Macs: a default-branch job saves the cache after its
command on Mac A; the next job restores it on Mac B before its command (the command sees it),
the tree digest equal; Mac A downloads nothing; a changed lock file misses; a restore key gives a
partial hit; a Mac with another Xcode build misses. Each outcome is on the stage's record and in
its log."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_cli.api import RelevoApi
from relevo_core.models.capabilities import Capabilities
from relevo_core.store.codec import from_attributes
from tests.helpers.agents import agent_at, handle_received
from tests.helpers.stack import job_items, receive_stage, wait_for_execution

pytestmark = pytest.mark.timeout(300)

# The command builds the dependencies only when the cache did not bring them (and says which).
BUILD = (
    'if [ -f .deps/lib.txt ]; then echo "deps restored: $(cat .deps/lib.txt)"; '
    'else mkdir -p .deps/bin && cat deps.lock > .deps/lib.txt && printf "#!/bin/sh\\n" > .deps/bin/tool && '
    "chmod 755 .deps/bin/tool && ln -s ../lib.txt .deps/bin/lib && echo built; fi"
)
CACHES = [
    {
        "name": "deps",
        "paths": [".deps"],
        "key": "deps-{xcode_build}-{arch}-{hash:deps.lock}",
        "restore_keys": ["deps-{xcode_build}-{arch}-"],
    }
]


def _mac(
    tmp_path: Path, stack, name: str, project_id: str, lock: str, xcode_build: str = "16C5032a"
) -> Agent:
    agent = agent_at(tmp_path, stack, name)
    agent.stages.command.capabilities = Capabilities(
        os="darwin", arch="arm64", macos="15.2", xcode="16.2", xcode_build=xcode_build
    )
    workspace = tmp_path / name / project_id
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "deps.lock").write_text(lock)
    return agent


def _log(api: RelevoApi, job_id: str) -> str:
    return "".join(chunk["text"] for chunk in api.job_logs(job_id)["chunks"])


def _run(stack, api: RelevoApi, project_id: str, agent: Agent) -> dict:
    job_id = api.run_project(project_id, {"ref": "main", "commit": secrets.token_hex(20)})["job_id"]
    task, receipt = receive_stage(stack, job_id, timeout=30)
    handle_received(
        agent,
        Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )
    assert wait_for_execution(stack, job_id)["status"] == "SUCCEEDED"
    items = [from_attributes(i) for i in job_items(stack, job_id)]
    stage = next(item for item in items if item["sk"].startswith("STAGE#"))
    return {**stage["caches"][0], "log": _log(api, job_id)}


def test_a_cache_saved_on_one_mac_is_restored_before_the_command_on_another(
    local_stack, project_id, tmp_path
):
    # Given a project whose build stage keeps its dependencies in a cache keyed on the lock file
    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 60,
            "caches": CACHES,
            "stages": [{"name": "build", "run": BUILD, "cache": ["deps"]}],
        },
    )
    mac_a = _mac(tmp_path, local_stack, "mac-a", project_id, "pins 1\n")
    mac_b = _mac(tmp_path, local_stack, "mac-b", project_id, "pins 1\n")

    # When a job of main builds on Mac A (a miss, then saved) and the next one runs on Mac B
    first = _run(local_stack, api, project_id, mac_a)
    second = _run(local_stack, api, project_id, mac_b)

    # Then A saved it and B restored it before its command, the tree digest equal, bytes downloaded
    assert (first["restore"], first["save"]) == ("miss", "saved")
    assert (second["restore"], second["restored_key"], second["save"]) == ("hit", first["key"], "exists")
    assert second["digest"] == first["digest"] and second["downloaded_bytes"] > 0
    # and both logs say so: A built the dependencies, B's command found them restored
    assert "[relevo] cache deps: miss: no entry for" in first["log"] and "\nbuilt\n" in first["log"]
    assert f"[relevo] cache deps: hit {first['key']}" in second["log"]
    assert "deps restored: pins 1" in second["log"]
    workspace_b = tmp_path / "mac-b" / project_id
    assert (workspace_b / ".deps" / "bin" / "tool").stat().st_mode & 0o777 == 0o755
    assert (workspace_b / ".deps" / "bin" / "lib").readlink() == Path("../lib.txt")

    # When Mac A runs it again: the same key, from its own content cache
    again = _run(local_stack, api, project_id, mac_a)
    assert (again["restore"], again["downloaded_bytes"]) == ("hit", 0)

    # When the lock file changes on Mac B: its key misses, the restore key finds the older entry
    (workspace_b / "deps.lock").write_text("pins 2\n")
    partial = _run(local_stack, api, project_id, mac_b)
    assert (partial["restore"], partial["restored_key"]) == ("partial", first["key"])
    assert partial["key"] != first["key"] and partial["save"] == "saved"

    # When a Mac with another Xcode build runs it with the first lock file: a miss
    mac_c = _mac(tmp_path, local_stack, "mac-c", project_id, "pins 1\n", xcode_build="16C5031c")
    other = _run(local_stack, api, project_id, mac_c)
    assert other["restore"] == "miss" and other["key"] != first["key"]


def test_the_next_job_goes_to_the_mac_that_saved_the_cache_though_another_received_it_first(
    local_stack, project_id, tmp_path
):
    """Issue 46, point 3: placement prefers a Mac holding the stage's cache (docs/caches.md,
    Placement), as it prefers the Mac where a previous stage's files wait, within the same bound."""
    from datetime import UTC, datetime

    from relevo_agent.config import AgentConfig
    from relevo_core.store import agents
    from relevo_core.store.agents import AgentPresence

    # Given a project whose build stage keeps its dependencies in a cache, saved by a job on Mac A
    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 60,
            "caches": CACHES,
            "stages": [{"name": "build", "run": BUILD, "cache": ["deps"]}],
        },
    )
    mac_a = _mac(tmp_path, local_stack, "mac-a", project_id, "pins 1\n")
    first = _run(local_stack, api, project_id, mac_a)
    assert (first["restore"], first["save"]) == ("miss", "saved")
    # and Mac A waits for work (its presence record: online, a free slot), while Mac B is an agent
    # that waits up to 10 s for a better placed Mac
    agents.put_presence(
        local_stack.table_name,
        AgentPresence(
            agent_id="mac-a",
            region="eu-west",
            capacity=1,
            running=0,
            version="0.1.0",
            last_seen=datetime.now(UTC),
            interval_sec=30,
        ),
    )
    waiting = AgentConfig(
        **{
            **_mac(tmp_path, local_stack, "mac-b", project_id, "pins 1\n").config.model_dump(),
            "prefer_previous_sec": 10,
        }
    )
    mac_b = Agent(
        waiting, local_stack.table_name, local_stack.work_queues["eu-west"], api_url=local_stack.api_url
    )
    mac_b.stages.command.capabilities = mac_a.stages.command.capabilities

    # When Mac B receives the next job's stage first
    job_id = api.run_project(project_id, {"ref": "main", "commit": secrets.token_hex(20)})["job_id"]
    task, receipt = receive_stage(local_stack, job_id, timeout=30)
    handle_received(
        mac_b,
        Message(mac_b.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )

    # Then it passed it on without claiming it, and Mac A, receiving it next, runs it
    items = [from_attributes(i) for i in job_items(local_stack, job_id)]
    assert not [item for item in items if item["sk"].startswith("STAGE#") and item.get("agent_id")]
    task, receipt = receive_stage(local_stack, job_id, timeout=30)
    handle_received(
        mac_a,
        Message(mac_a.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    items = [from_attributes(i) for i in job_items(local_stack, job_id)]
    stage = next(item for item in items if item["sk"].startswith("STAGE#"))
    # restoring the entry it saved from its own content cache: 0 bytes downloaded
    assert stage["agent_id"] == "mac-a"
    cache = stage["caches"][0]
    assert (cache["restore"], cache["restored_key"], cache["downloaded_bytes"]) == ("hit", first["key"], 0)
