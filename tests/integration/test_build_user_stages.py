"""Stages run as a build user (`run_as`) on the local stack, with a real OS user: a real
relevo-agent process (root) whose stage tries to read each of the agent's credential sources and
its journal, and is refused each by the kernel; and a checkout and handoff chain on two Macs
(the agent's code in this process) whose workspaces are the build user's, the files handed on
owned by it with their modes, mtimes and links as the build left them, and whose git in the
workspace is the build user's: a command a build leaves in the repository's config never runs as root."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from relevo_agent.config import AgentConfig
from relevo_agent.messages import Message
from relevo_agent.service import Agent
from relevo_cli.api import RelevoApi
from relevo_core.files.private import write_private
from relevo_core.files.stack import write_stack_file
from relevo_core.store import log_reads
from relevo_local.processes import agent_process
from tests.helpers.agents import handle_received
from tests.helpers.payloads import push_body
from tests.helpers.stack import deliver, receive_stage, register_project, wait_for_execution
from tests.helpers.tree import tree_listing

pytestmark = pytest.mark.timeout(180)


def _log(stack, job_id: str) -> str:
    text, from_seq = "", 0
    while from_seq is not None:
        page = log_reads.read_chunks(stack.table_name, job_id, from_seq=from_seq, limit=50)
        text += "".join(chunk.data for chunk in page.chunks)
        from_seq = page.next_seq
    return text


def test_a_stage_of_a_real_agent_cannot_read_its_credential_sources_or_its_journal(
    local_stack, project_id, build_user, shared_dir: Path, tmp_path: Path
):
    # Given a relevo-agent (root) with run_as, its config, journal and stack file as it makes
    # them, and its user's AWS credentials, all where only each file's own mode guards it
    agent_dir, home = shared_dir / "agent", shared_dir / "agent-home"
    (home / ".aws").mkdir(parents=True)
    agent_dir.mkdir()
    for directory in (agent_dir, home, home / ".aws"):
        directory.chmod(0o755)
    credentials = home / ".aws" / "credentials"
    credentials.write_text("[default]\naws_secret_access_key = SECRET-OF-THE-AGENT-USER\n")
    credentials.chmod(0o600)
    stack_file = write_stack_file(local_stack, agent_dir / "stack.json")
    journal = agent_dir / "journal.sqlite3"
    config = write_private(
        agent_dir / "agent.toml",
        "\n".join(
            [
                f'agent_id = "mac-runas-{secrets.token_hex(3)}"',
                'region = "eu-west"',
                "capacity = 1",
                f'workspace_root = "{shared_dir / "workspaces"}"',
                f'journal = "{journal}"',
                f'stack_file = "{stack_file}"',
                "poll_wait_sec = 1",
                "max_clock_skew_sec = 1.0",
                f'run_as = "{build_user.name}"',
                "",
            ]
        ),
    )
    private = [
        str(config),
        str(journal),
        f"{journal}-wal",
        f"{journal}-shm",
        str(stack_file),
        str(credentials),
    ]
    reads = " ".join(f'"{path}"' for path in private)
    command = (
        f'id -u; for f in {reads} "/proc/$PPID/environ"; do cat "$f" > /dev/null; echo "exit $? $f"; done'
    )
    secret = register_project(local_stack, project_id, [{"name": "build", "run": command}])

    # When the agent runs a job's stage
    environment = {"HOME": str(home), "AWS_SHARED_CREDENTIALS_FILE": str(credentials)}
    with agent_process(config, tmp_path / "agent.log", env=environment) as agent:
        job_id = deliver(
            local_stack, project_id, push_body(f"acme/{project_id}", secrets.token_hex(20)), secret
        ).json()["job_id"]
        execution = wait_for_execution(local_stack, job_id, timeout=120)
        agent_pid = agent.pid
    assert execution["status"] == "SUCCEEDED", (tmp_path / "agent.log").read_text()[-3000:]

    # Then the stage ran as the build user, and the kernel refused it each of them
    log = _log(local_stack, job_id)
    assert log.splitlines()[0] == str(build_user.uid), log
    for path in [*private, f"/proc/{agent_pid}/environ"]:
        assert f"cat: {path}: Permission denied" in log, log
        assert f"exit 1 {path}" in log
    assert "SECRET" not in log


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


# A bundle as a build leaves it: a set-user-ID executable, a symlink, odd mtimes with nanoseconds.
BUILD = (
    "mkdir -p build/App.app/Frameworks; printf '#!/bin/sh\\necho app\\n' > build/App.app/App; chmod 4755 "
    "build/App.app/App; "
    "echo plist > build/App.app/Info.plist; chmod 640 build/App.app/Info.plist; ln -s App "
    "build/App.app/Current; "
    "touch -d @1700000000.123456789 build/App.app/App; touch -d @1700000001.987654321 "
    "build/App.app/Info.plist; "
    "touch -h -d @1700000002.5 build/App.app/Current; touch -d @1700000003.25 build/App.app/Frameworks "
    "build/App.app; "
    'echo "uid=$(id -u)" >> "$RELEVO_OUTPUT"; echo "home=$HOME" >> "$RELEVO_OUTPUT"'
)
# On the other Mac: its own files, restored and checked out, are the build user's to change; git
# works. Then it does what a hostile build could: a command in the repository's config that the
# next checkout's git runs (core.fsmonitor), noting whose it ran as.
SIGN = (
    "test -O build/App.app/App && test -w build/App.app/App && test -O build/App.app/Frameworks && test -O "
    "VERSION && test -O .git && "
    'git status --porcelain > /dev/null && echo "uid=$(id -u)" >> "$RELEVO_OUTPUT" && '
    'git config core.fsmonitor "id -u >> $HOME/fsmonitor-$RELEVO_JOB_ID; false"'
)


def _agent(root: Path, journal: Path, stack, agent_id: str, user: str) -> Agent:
    config = AgentConfig(
        agent_id=agent_id,
        region="eu-west",
        capacity=1,
        workspace_root=root / agent_id,
        journal=journal,
        max_clock_skew_sec=0.5,
        prefer_previous_sec=0,
        handoff_max_wait_sec=0,
        run_as=user,
    )
    return Agent(config, stack.table_name, stack.work_queues["eu-west"], api_url=stack.api_url)


def _run_next(stack, agent: Agent, job_id: str) -> dict:
    task, receipt = receive_stage(stack, job_id, timeout=30)
    handle_received(
        agent,
        Message(agent.queue_url, {"Body": json.dumps(task), "ReceiptHandle": receipt, "MessageId": "m"}),
    )
    return task


def test_a_checkout_and_handoff_on_two_macs_leave_workspaces_the_build_users_with_modes_mtimes_and_links(
    local_stack, project_id, build_user, shared_dir: Path, tmp_path: Path
):
    # Given a project that checks a repository out and hands build's bundle on, and two Macs with run_as
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    _git("init", "--bare", "--quiet", "-b", "main", str(origin), cwd=tmp_path)
    _git("clone", "--quiet", str(origin), str(work), cwd=tmp_path)
    (work / "VERSION").write_text("1.4.0\n")
    _git("add", ".", cwd=work)
    _git("commit", "--quiet", "-m", "1.4.0", cwd=work)
    _git("push", "--quiet", "origin", "HEAD:main", cwd=work)
    api = RelevoApi.for_stack(local_stack)
    api.put_project(
        project_id,
        {
            "repo": f"acme/{project_id}",
            "region_affinity": "eu-west",
            "lease_ttl_sec": 10,
            "queue_timeout_sec": 60,
            "checkout": {"url": str(origin), "timeout_sec": 60},
            "stages": [
                {"name": "build", "run": BUILD, "handoff": ["build/App.app"]},
                {"name": "sign", "run": SIGN},
                {"name": "upload", "run": "true"},
            ],
        },
    )
    mac_a = _agent(shared_dir, tmp_path / "a.sqlite3", local_stack, "mac-a", build_user.name)
    mac_b = _agent(shared_dir, tmp_path / "b.sqlite3", local_stack, "mac-b", build_user.name)

    # When build runs on Mac A, then sign and upload on Mac B
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    assert _run_next(local_stack, mac_a, job_id)["stage"] == "build"
    assert _run_next(local_stack, mac_b, job_id)["stage"] == "sign"
    assert _run_next(local_stack, mac_b, job_id)["stage"] == "upload"

    # Then both ran as the build user, in its home, and sign's checks of what it owns passed
    assert wait_for_execution(local_stack, job_id)["status"] == "SUCCEEDED"
    stages = {stage["name"]: stage for stage in api.get_job(job_id)["stages"]}
    assert stages["build"]["outputs"] == {"uid": str(build_user.uid), "home": str(build_user.home)}
    assert (
        stages["sign"]["outputs"] == {"uid": str(build_user.uid)}
        and stages["sign"]["handoff"]["restored_bytes"] > 0
    )
    # and what Mac B restored is what the build left on Mac A: types, modes (set-user-ID too), mtimes, bytes,
    # link targets
    made, restored = shared_dir / "mac-a" / project_id, shared_dir / "mac-b" / project_id
    assert tree_listing(restored, "build/App.app") == tree_listing(made, "build/App.app")
    assert ("build/App.app/App", "file", "0o4755", "1700000000123456789") == tree_listing(
        restored, "build/App.app/App"
    )[0][:4]
    # and every entry of Mac B's workspace, checkout and restore alike, is the build user's
    others = [path for path in [restored, *restored.rglob("*")] if os.lstat(path).st_uid != build_user.uid]
    assert others == []
    assert os.path.islink(restored / "build/App.app/Current") and (restored / ".git" / "HEAD").is_file()
    # and the command sign left in the repository's config ran in upload's checkout, as the build user, never
    # as root
    ran = (build_user.home / f"fsmonitor-{job_id}").read_text().split()
    assert ran and set(ran) == {str(build_user.uid)}
