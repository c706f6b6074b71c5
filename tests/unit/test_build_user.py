"""A stage run as the build user (`run_as`, relevo_agent.build_user), with a real OS user and real
processes, the test process standing for the agent (root): the command's uid, groups, home and
umask; what of the agent's it cannot read, each refused by the kernel to the command itself (its
own `cat` says "Permission denied"), and doctor's warning while one is readable; the workspace
handed to it with modes, mtimes and links as they were, and no hard link followed; its whole
process group killed on a timeout, a cancel and the fence; the agent reading the build user's
repository without running anything of its config, and uploading no artifact through a link the
build left."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from relevo_agent.artifacts import ArtifactFailure, upload_artifacts
from relevo_agent.build_user import BuildUser
from relevo_agent.config import AgentConfig
from relevo_agent.doctor import check_build_user
from relevo_agent.executor import ExecResult, run_command
from relevo_agent.hygiene import Hygiene
from relevo_agent.journal import Journal, Operation
from relevo_agent.lease import Lease
from relevo_agent.outputs import OutputWatch
from relevo_agent.stage_env import as_build_user
from relevo_core.files.private import write_private
from relevo_core.files.stack import LocalCredentials, StackInfo, write_stack_file
from relevo_core.fleet.lease_timeline import LeaseTimeline
from relevo_core.models.errors import ErrorClass
from relevo_core.store.stage_attempts import StageRef
from tests.helpers.processes import is_dead, wait_until
from tests.helpers.tree import make_bundle, tree_listing

BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}


def _run(
    user: BuildUser,
    command: str,
    workspace: Path,
    timeout_sec: float = 20,
    cancel: threading.Event | None = None,
    on_output: Callable[[bytes], None] | None = None,
    **kwargs,
) -> tuple[ExecResult, str]:
    chunks: list[bytes] = []

    def output(chunk: bytes) -> None:
        chunks.append(chunk)
        if on_output is not None:
            on_output(chunk)

    result = run_command(
        command,
        workspace,
        dict(BASE_ENV),
        timeout_sec,
        cancel or threading.Event(),
        output,
        user=user,
        **kwargs,
    )
    return result, b"".join(chunks).decode()


def test_a_stage_runs_as_the_build_user_with_its_groups_home_and_umask(
    build_user: BuildUser, shared_dir: Path
):
    workspace = shared_dir / "workspaces" / "app"

    result, output = _run(
        build_user,
        'echo "$(id -u) $(id -g) [$(id -G)] $HOME $USER $LOGNAME $(umask) $(pwd)"; echo made > made',
        workspace,
    )

    assert result.exit_code == 0, output
    uid, gid, groups, rest = (
        output.split(" ", 2)[0],
        output.split(" ", 2)[1],
        output.split("[")[1].split("]")[0],
        output.split("] ")[1],
    )
    assert (int(uid), int(gid)) == (build_user.uid, build_user.gid)
    assert {int(group) for group in groups.split()} == set(
        build_user.groups
    ) and 0 not in build_user.groups  # none of root's
    assert rest.split() == [str(build_user.home), build_user.name, build_user.name, "0022", str(workspace)]
    made = os.stat(workspace / "made")
    assert (made.st_uid, stat.S_IMODE(made.st_mode)) == (build_user.uid, 0o644)


def test_the_build_user_cannot_read_the_agents_config_journal_stack_file_aws_credentials_or_environment(
    build_user: BuildUser, shared_dir: Path
):
    # Given the agent's files as the agent makes them, in directories anyone may search: only
    # each file's own mode guards it (on macOS a home directory is drwxr-xr-x)
    agent, home = shared_dir / "agent", shared_dir / "agent-home"
    (home / ".aws").mkdir(parents=True)
    agent.mkdir()
    for directory in (agent, home, home / ".aws"):
        directory.chmod(0o755)
    config = write_private(
        agent / "agent.toml", 'region = "eu-west"\nrun_as = "relevo-build"\n'
    )  # relevo-agent init
    stack_file = write_stack_file(
        StackInfo(
            api_url="http://127.0.0.1:1",
            region="us-east-1",
            resources={},
            work_queues={},
            local_credentials=LocalCredentials(
                access_key_id="AKIASTACKFILE", secret_access_key="SECRET-OF-THE-STACK"
            ),
        ),
        agent / "stack.json",
    )
    credentials = home / ".aws" / "credentials"
    credentials.write_text("[default]\naws_secret_access_key = SECRET-OF-THE-AGENT-USER\n")
    credentials.chmod(0o600)  # as `aws configure` writes it
    journal = Journal(agent / "journal.sqlite3")  # open, as in a running agent: its -wal and -shm exist
    journal.begin(Operation("job_1:build", "job_1", "build", 0, 1, "/ws", ""))
    private = [
        config,
        journal.path,
        Path(f"{journal.path}-wal"),
        Path(f"{journal.path}-shm"),
        stack_file,
        credentials,
        Path(f"/proc/{os.getpid()}/environ"),
    ]
    assert [stat.S_IMODE(os.stat(path).st_mode) for path in private[:5]] == [0o600] * 5

    # When a stage run as the build user tries to read each of them
    reads = "; ".join(f'cat "{path}" > /dev/null; echo "exit $? {path}"' for path in private)
    result, output = _run(build_user, reads, shared_dir / "workspaces" / "app")
    journal.close()

    # Then the kernel refused every one to the command itself
    assert result.exit_code == 0, output
    for path in private:
        assert f"cat: {path}: Permission denied" in output, output
        assert f"exit 1 {path}" in output
    assert "SECRET" not in output


def test_doctor_warns_of_each_private_file_the_build_user_could_read_until_the_agent_tightens_it(
    build_user: BuildUser, shared_dir: Path, monkeypatch
):
    import sqlite3

    # Given an older agent's journal and a stack file written with the umask's 0644
    agent, home = shared_dir / "agent", shared_dir / "agent-home"
    agent.mkdir(mode=0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE")
    monkeypatch.delenv("AWS_CONFIG_FILE")
    config_file = write_private(agent / "agent.toml", "")
    journal, stack_file = agent / "journal.sqlite3", agent / "stack.json"
    sqlite3.connect(journal).close()
    stack_file.write_text("{}")
    for path in (journal, stack_file):
        path.chmod(0o644)
    config = AgentConfig(
        region="eu-west",
        workspace_root=shared_dir / "ws",
        journal=journal,
        stack_file=stack_file,
        run_as=build_user.name,
    )

    # When doctor looks, then it says who stages run as, and warns of both
    lines = [check.line() for check in check_build_user(config, config_file)]
    assert lines == [
        f"ok    build user: stages run as {build_user.name} (uid {build_user.uid}, gid {build_user.gid}, "
        f"home {build_user.home})",
        f"warn  private files: the build user {build_user.name} can read {journal} (-rw-r--r--), "
        f"{stack_file} (-rw-r--r--): chmod 600 each",
    ]
    # and once the agent has opened its journal (it tightens it) and the stack file is 600, of none
    Journal(journal).close()
    stack_file.chmod(0o600)
    assert [check.line() for check in check_build_user(config, config_file)][1] == (
        f"ok    private files: the build user {build_user.name} can read none of the agent's config, "
        "journal, stack file and AWS files"
    )


def test_the_build_users_environment_names_nothing_of_the_agent_users():
    user = BuildUser("relevo-build", 5001, 5001, (5001,), Path("/Users/relevo-build"))
    agent_home = "/var/root"
    env = {
        "PATH": f"{agent_home}/.local/bin:/opt/homebrew/bin:/usr/bin",
        "HOME": agent_home,
        "USER": "root",
        "LOGNAME": "root",
        "XDG_CONFIG_HOME": f"{agent_home}/.config",
        "CARGO_HOME": f"{agent_home}/.cargo",
        "SSH_AUTH_SOCK": "/private/tmp/com.apple.launchd.x/Listeners",
        "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus",
        "XDG_RUNTIME_DIR": "/run/user/0",
        "KRB5CCNAME": "/tmp/krb5cc_0",
        "TMPDIR": "/var/folders/zz/private/T/",
        "LANG": "en_US.UTF-8",
        "RELEVO_JOB_ID": "job_1",
        "GIT_CEILING_DIRECTORIES": "/Users/Shared/relevo",
    }

    got = as_build_user(env, user, agent_homes=(agent_home,))

    assert got == {
        "PATH": "/opt/homebrew/bin:/usr/bin",
        "LANG": "en_US.UTF-8",
        "RELEVO_JOB_ID": "job_1",
        "GIT_CEILING_DIRECTORIES": "/Users/Shared/relevo",
        "HOME": "/Users/relevo-build",
        "USER": "relevo-build",
        "LOGNAME": "relevo-build",
    }
    # A temporary directory every user shares stays; one of the agent's own (not there, or private) goes.
    assert as_build_user({"TMPDIR": "/tmp"}, user, agent_homes=())["TMPDIR"] == "/tmp"


def test_the_workspace_is_handed_over_with_modes_mtimes_and_links_and_no_hard_link_is_followed(
    build_user: BuildUser, shared_dir: Path
):
    # Given a workspace the agent (root) filled: a bundle with links, odd modes and mtimes, a
    # set-user-ID tool, and a hard link a build made to a file of root's outside it
    workspace = shared_dir / "app"
    make_bundle(workspace)
    tool = workspace / "build" / "tool"
    tool.write_bytes(b"#!/bin/sh\n")
    os.chmod(tool, 0o4755)
    os.utime(tool, ns=(1_700_000_000_987_654_321, 1_700_000_000_987_654_321))
    system_file = shared_dir / "system-file"
    system_file.write_text("root's\n")
    system_file.chmod(0o600)
    os.link(system_file, workspace / "build" / "linked")
    before = tree_listing(workspace, "build")

    # When it is handed to the build user (before each command)
    build_user.hand_over(workspace)

    # Then every entry is the build user's, with the same type, mode, mtime, bytes and link target
    assert tree_listing(workspace, "build") == before
    assert ("build/tool", "file", "0o4755") == before[[row[0] for row in before].index("build/tool")][:3]
    owners = {
        path.relative_to(workspace).as_posix(): os.lstat(path).st_uid
        for path in [workspace, *workspace.rglob("*")]
    }
    assert {path for path, uid in owners.items() if uid != build_user.uid} == {"build/linked"}
    assert any(os.path.islink(workspace / path) for path in owners)
    # but root's file, linked in by the build, was not given away
    assert (os.stat(system_file).st_uid, stat.S_IMODE(os.stat(system_file).st_mode)) == (0, 0o600)


def test_the_agent_reads_the_commit_of_a_build_users_repository_and_runs_nothing_of_its_config(
    build_user: BuildUser, shared_dir: Path
):
    """A project without checkout: its precondition is what the ref resolves to in the workspace,
    a repository of the build user's (git refuses another owner's unless told it is safe)."""
    import subprocess

    from relevo_agent.reconcile import precondition_version

    workspace = shared_dir / "app"
    git = {
        "env": {
            "GIT_AUTHOR_NAME": "b",
            "GIT_AUTHOR_EMAIL": "b@e",
            "GIT_COMMITTER_NAME": "b",
            "GIT_COMMITTER_EMAIL": "b@e",
            "PATH": "/usr/bin:/bin",
            "HOME": str(shared_dir),
        },
        "check": True,
        "capture_output": True,
        "text": True,
    }
    subprocess.run(["git", "init", "--quiet", str(workspace)], **git)
    subprocess.run(["git", "-C", str(workspace), "commit", "--quiet", "--allow-empty", "-m", "one"], **git)
    head = subprocess.run(["git", "-C", str(workspace), "rev-parse", "HEAD"], **git).stdout.strip()
    ran = shared_dir / "fsmonitor-ran"
    subprocess.run(["git", "-C", str(workspace), "config", "core.fsmonitor", f"touch {ran}; false"], **git)
    build_user.hand_over(workspace)

    assert precondition_version(workspace, "HEAD", None, ()).startswith(f"commit={head};")
    assert not ran.exists()


@pytest.mark.parametrize("how", ["timeout", "cancel", "fence"])
def test_a_build_users_command_is_killed_with_its_whole_group(
    build_user: BuildUser, shared_dir: Path, how: str
):
    # Given a command of the build user that leaves a child behind and ignores SIGTERM
    workspace = shared_dir / "app"
    command = 'id -u; sleep 300 & echo $! > child; trap "" TERM; echo started; sleep 300'
    cancel = threading.Event()
    lease = (
        Lease(LeaseTimeline(lease_ttl_sec=1, kill_grace_sec=0.2, max_clock_skew_sec=0.1), time.monotonic())
        if how == "fence"
        else None
    )

    # When its timeout passes, it is canceled, or its lease's fence passes (the supervisor, root's, kills);
    # the timeout leaves the command time to start as the build user on a loaded machine (0.5 s did not).
    result, output = _run(
        build_user,
        command,
        workspace,
        timeout_sec=2.0 if how == "timeout" else 30,
        cancel=cancel,
        grace_sec=0.2,
        lease=lease,
        on_output=lambda chunk: cancel.set() if how == "cancel" and b"started" in chunk else None,
    )

    # Then the whole group died: the command by SIGKILL after the grace, and its child
    assert output.splitlines()[0] == str(build_user.uid)
    assert result.signaled == signal.SIGKILL
    assert {
        "timeout": result.timed_out,
        "cancel": result.canceled,
        "fence": lease is not None and lease.fenced(result.ended_at),
    }[how]
    child = int((workspace / "child").read_text())
    assert wait_until(lambda: is_dead(child)), f"the child {child} outlived its group"


def test_the_values_file_is_the_build_users_in_a_directory_it_cannot_list_or_change(
    build_user: BuildUser, shared_dir: Path
):
    watch = OutputWatch.create(
        shared_dir / ".relevo-outputs" / "job_1.build.1", [], lambda values, changed: None, owner=build_user
    )

    result, output = _run(
        build_user,
        f'echo "version=1.4" >> "{watch.path}"; ls "{watch.path.parent}"; ln -s /etc/hostname '
        f'"{watch.path.parent}/x"',
        shared_dir / "app",
    )

    assert "version=1.4" in watch.path.read_text()
    assert (
        os.stat(watch.path).st_uid == build_user.uid
        and stat.S_IMODE(os.stat(watch.path.parent).st_mode) == 0o711
    )
    assert "Permission denied" in output and not (watch.path.parent / "x").exists(), output


def test_the_workspace_cleanup_runs_as_the_build_user_without_the_agents_credentials(
    build_user: BuildUser, shared_dir: Path, tmp_path: Path, monkeypatch
):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SECRET-OF-THE-AGENT")
    workspace_root = shared_dir / "workspaces"
    config = AgentConfig(
        region="eu-west",
        workspace_root=workspace_root,
        journal=tmp_path / "journal.sqlite3",
        run_as=build_user.name,
    )
    workspace = workspace_root / "app"
    workspace.mkdir(parents=True)
    build_user.hand_over(workspace)
    hygiene = Hygiene(config, Journal(config.journal), set)

    hygiene.stage_ended("app", workspace, 'echo "$(id -u) $HOME ${AWS_SECRET_ACCESS_KEY:-none}" > cleaned')
    hygiene.between_stages()

    assert (workspace / "cleaned").read_text().split() == [str(build_user.uid), str(build_user.home), "none"]


def test_an_artifact_directory_the_build_replaced_by_a_link_uploads_nothing(tmp_path: Path):
    """Root would upload whatever the link points at (the agent's ~/.aws): refused before any call."""
    secrets = tmp_path / "agent-home" / ".aws"
    secrets.mkdir(parents=True)
    (secrets / "credentials").write_text("[default]\naws_secret_access_key = x\n")
    artifact_dir = tmp_path / "ws" / ".relevo-artifacts" / "job_1" / "build"
    artifact_dir.parent.mkdir(parents=True)
    artifact_dir.symlink_to(secrets)

    with pytest.raises(ArtifactFailure) as refused:
        upload_artifacts(
            StageRef("table", "job_1", 0, 1, "mac-1"),
            "build",
            artifact_dir,
            "s3://bucket/job_1/",
            None,
            lambda line: None,
            0,
        )

    assert refused.value.error_class is ErrorClass.HANDOFF_PATH and "nothing uploaded" in str(refused.value)
