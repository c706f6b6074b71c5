"""The agent's config defaults, its launchd plist (read back with plistlib on any OS) and the
doctor's offline checks."""

from __future__ import annotations

import plistlib
import socket
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_agent import launchd
from relevo_agent.cli import app
from relevo_agent.config import AgentConfig
from relevo_agent.doctor import check_clock, check_disk


def _load(tmp_path: Path, text: str) -> AgentConfig:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return AgentConfig.load(path)


def test_defaults_agent_id_is_the_host_name_and_capacity_two(tmp_path: Path):
    config = _load(tmp_path, 'region = "eu-west"\nstack_file = "stack.json"\n')
    assert config.agent_id == socket.gethostname()
    assert config.capacity == 2
    assert config.mask == ()


@pytest.mark.parametrize("setting", ["log_retention_days", "artifact_retention_days"])
def test_retention_is_refused_in_the_agent_config_since_the_stack_decides_it(tmp_path: Path, setting: str):
    with pytest.raises(ValueError, match=f"{setting} is not an agent setting: the stack's"):
        _load(tmp_path, f'region = "eu-west"\n{setting} = 7\n')


@pytest.mark.parametrize(("given", "expected"), [(0, 1), (-3, 1), (1, 1), (4, 4)])
def test_a_capacity_of_zero_or_less_means_one(tmp_path: Path, given: int, expected: int):
    assert _load(tmp_path, f'region = "eu-west"\ncapacity = {given}\n').capacity == expected


def test_paths_are_relative_to_the_config_file_and_mask_is_a_list_of_names(tmp_path: Path):
    config = _load(
        tmp_path,
        'region = "us-east"\nworkspace_root = "ws"\njournal = "j.sqlite3"\nmask = ["ASC_KEY", '
        '"MATCH_PASSWORD"]\n',
    )
    assert config.workspace_root == tmp_path / "ws"
    assert config.journal == tmp_path / "j.sqlite3"
    assert config.mask == ("ASC_KEY", "MATCH_PASSWORD")


def test_unknown_settings_are_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="capacitty"):
        _load(tmp_path, 'region = "eu-west"\ncapacitty = 3\n')


def test_the_plist_keeps_the_agent_alive_and_names_its_log_files(tmp_path: Path):
    paths = launchd.ServicePaths(home=tmp_path, label="dev.relevo.agent")
    config = tmp_path / "relevo" / "agent.toml"
    plist = plistlib.loads(
        plistlib.dumps(
            launchd.plist_for(
                config,
                paths,
                python="/Users/ci/.local/pipx/venvs/relevo-agent/bin/python",
                environ={"AWS_PROFILE": "relevo", "HOME": "x"},
            )
        )
    )
    assert plist["Label"] == "dev.relevo.agent"
    assert plist["ProgramArguments"] == [
        "/Users/ci/.local/pipx/venvs/relevo-agent/bin/python",
        "-m",
        "relevo_agent.launch",
        "--config",
        str(config.resolve()),
    ]
    assert plist["KeepAlive"] is True and plist["RunAtLoad"] is True
    assert plist["StandardOutPath"] == str(tmp_path / "Library/Logs/relevo-agent/agent.out.log")
    assert plist["StandardErrorPath"] == str(tmp_path / "Library/Logs/relevo-agent/agent.err.log")
    assert plist["ExitTimeOut"] >= 60, "launchd must give running stages time before SIGKILL"
    assert plist["EnvironmentVariables"]["AWS_PROFILE"] == "relevo"
    assert "HOME" not in plist["EnvironmentVariables"]
    assert "/opt/homebrew/bin" in plist["EnvironmentVariables"]["PATH"]


class Launchctl:
    """Records launchctl invocations (the one macOS tool the service commands drive)."""

    def __init__(self, print_output: str = "", returncode: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.print_output, self.returncode = print_output, returncode

    def __call__(self, args):
        self.calls.append(list(args))
        return subprocess.CompletedProcess(args, self.returncode, stdout=self.print_output, stderr="")


def test_install_writes_then_bootstraps_and_uninstall_boots_out(tmp_path: Path):
    paths = launchd.ServicePaths(home=tmp_path)
    launchctl = Launchctl()
    launchd.install(tmp_path / "agent.toml", paths, load=True, run=launchctl)
    assert paths.plist == tmp_path / "Library/LaunchAgents/dev.relevo.agent.plist"
    assert plistlib.loads(paths.plist.read_bytes())["Label"] == "dev.relevo.agent"
    assert launchctl.calls[-1][:2] == ["launchctl", "bootstrap"] and launchctl.calls[-1][-1] == str(
        paths.plist
    )
    # a second install replaces the loaded one
    launchd.install(tmp_path / "agent.toml", paths, load=True, run=launchctl)
    assert [c[1] for c in launchctl.calls] == ["bootstrap", "bootout", "bootstrap"]
    launchd.uninstall(paths, unload=True, run=launchctl)
    assert launchctl.calls[-1][1] == "bootout" and launchctl.calls[-1][2].endswith("/dev.relevo.agent")
    assert not paths.plist.exists()


def test_status_reads_launchctl_print(tmp_path: Path):
    paths = launchd.ServicePaths(home=tmp_path)
    assert launchd.status(paths, query=True, run=Launchctl()) == (
        False,
        f"not installed ({paths.plist} does not exist)",
    )
    launchd.install(tmp_path / "agent.toml", paths, load=False)
    output = (
        "gui/501/dev.relevo.agent = {\n\tactive count = 1\n\tstate = running\n\tpid = 4242\n\tlast "
        "exit code = (never exited)\n}\n"
    )
    running, words = launchd.status(paths, query=True, run=Launchctl(output))
    assert running and words.startswith("dev.relevo.agent is running (pid 4242)")
    running, words = launchd.status(paths, query=True, run=Launchctl(returncode=113))
    assert not running and "not loaded" in words


def test_service_install_writes_the_plist_on_any_os(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Given a valid config and a home directory (no launchctl on this OS is fine)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(launchd, "launchctl_available", lambda: False)
    config = tmp_path / "agent.toml"
    config.write_text('region = "eu-west"\n')
    # When `relevo-agent service install` runs
    result = CliRunner().invoke(app, ["service", "install", "--config", str(config)])
    # Then the plist is in ~/Library/LaunchAgents, pointing at that config
    assert result.exit_code == 0, result.output
    plist = plistlib.loads((tmp_path / "Library/LaunchAgents/dev.relevo.agent.plist").read_bytes())
    assert plist["ProgramArguments"][-2:] == ["--config", str(config)]
    assert "not loaded" in result.output
    status = CliRunner().invoke(app, ["service", "status"])
    assert status.exit_code == 1 and "installed at" in status.output
    assert CliRunner().invoke(app, ["service", "uninstall"]).exit_code == 0
    assert not (tmp_path / "Library/LaunchAgents/dev.relevo.agent.plist").exists()


def test_service_install_refuses_a_broken_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "agent.toml"
    config.write_text('region = "EU WEST"\n')
    result = CliRunner().invoke(app, ["service", "install", "--config", str(config)])
    assert result.exit_code != 0
    assert not (tmp_path / "Library/LaunchAgents").exists()


def test_a_daemon_is_the_systems_with_a_umask_its_build_user_can_work_under(tmp_path: Path):
    paths = launchd.ServicePaths(home=tmp_path, daemon=True)
    launchctl = Launchctl()

    launchd.install(tmp_path / "agent.toml", paths, load=True, run=launchctl)

    assert paths.plist == tmp_path / "Library/LaunchDaemons/dev.relevo.agent.plist"
    plist = plistlib.loads(paths.plist.read_bytes())
    assert plist["Umask"] == 0o022 and "UserName" not in plist  # root's, from boot
    assert plist["StandardErrorPath"] == str(tmp_path / "Library/Logs/relevo-agent/agent.err.log")
    assert launchctl.calls[-1] == ["launchctl", "bootstrap", "system", str(paths.plist)]
    launchd.uninstall(paths, unload=True, run=launchctl)
    assert launchctl.calls[-1] == ["launchctl", "bootout", "system/dev.relevo.agent"]


def test_service_install_pairs_a_daemon_with_run_as(
    tmp_path: Path, build_user, shared_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """Root runs stages only as a build user; a build user needs the agent to be root."""
    from relevo_agent import cli

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(cli, "SYSTEM_ROOT", tmp_path / "system")
    monkeypatch.setattr(launchd, "launchctl_available", lambda: False)
    plain, with_run_as = tmp_path / "plain.toml", tmp_path / "run-as.toml"
    plain.write_text('region = "eu-west"\n')
    with_run_as.write_text(
        f'region = "eu-west"\nrun_as = "{build_user.name}"\nworkspace_root = "{shared_dir / "ws"}"\n'
    )

    daemon_without = CliRunner().invoke(app, ["service", "install", "--daemon", "--config", str(plain)])
    run_as_without = CliRunner().invoke(app, ["service", "install", "--config", str(with_run_as)])
    daemon = CliRunner().invoke(app, ["service", "install", "--daemon", "--config", str(with_run_as)])

    assert daemon_without.exit_code == 2
    assert (
        daemon_without.output.strip()
        == f"{plain}: --daemon runs the agent as root: set run_as, so that its stages run as a build user"
    )
    assert run_as_without.exit_code == 2
    assert (
        run_as_without.output.strip()
        == f"{with_run_as}: run_as needs the agent to run as root: install it with --daemon"
    )
    assert daemon.exit_code == 0, daemon.output
    plist = plistlib.loads((tmp_path / "system/Library/LaunchDaemons/dev.relevo.agent.plist").read_bytes())
    assert plist["ProgramArguments"][-2:] == ["--config", str(with_run_as)]
    assert not (tmp_path / "Library/LaunchAgents").exists()
    assert CliRunner().invoke(app, ["service", "uninstall", "--daemon"]).exit_code == 0
    assert not (tmp_path / "system/Library/LaunchDaemons/dev.relevo.agent.plist").exists()


def test_clock_skew_is_reported_in_plain_words():
    aws = datetime(2026, 1, 1, tzinfo=UTC)
    assert check_clock(aws, aws + timedelta(seconds=2)).ok
    skewed = check_clock(aws, aws - timedelta(seconds=90))
    assert not skewed.ok and "90s behind AWS" in skewed.words
    assert not check_clock(None, aws).ok


def test_too_little_disk_space_fails(tmp_path: Path):
    assert check_disk(tmp_path / "not-yet" / "ws", 0).ok
    low = check_disk(tmp_path, 10**9)
    assert not low.ok and "GiB free" in low.words
