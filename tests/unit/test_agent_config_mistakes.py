"""Mistakes in an agent's TOML, as `relevo-agent run` and `doctor` report them: one line naming the
file, the line and the key, exit 2 from `run` (doctor keeps its FAIL lines and exit 1), never a
traceback or pydantic's text with its URLs. A region the stack has no work queue for is refused at
start, naming the stack's regions. No stack is contacted: the stack file is written here."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_agent.cli import app
from tests.helpers.stack_files import unreachable_stack_file

runner = CliRunner()


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(f'agent_id = "mac-1"\nstack_file = "{unreachable_stack_file(tmp_path)}"\n{body}')
    return path


def _lines(output: str) -> list[str]:
    assert "Traceback" not in output and "errors.pydantic.dev" not in output, output
    return [line for line in output.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('region = "eu-west"\ncapacity = = 2\n', "4:12: TOML syntax: Invalid value"),
        (
            'region = "eu-west"\ncapacity = "two"\n',
            "4: capacity: Input should be a valid integer, unable to parse string as an integer (got 'two')",
        ),
        ('regoin = "eu-west"\n', "3: unknown key 'regoin' (did you mean 'region'?)"),
        # stack_file is set: the stack's regions are named, not "set stack_file or queue_url"
        (
            'region = "ap-south"\n',
            "3: region: no work queue for region 'ap-south' in the stack {stack} (its region affinities: "
            "eu-west, us-east)",
        ),
    ],
    ids=["toml-syntax", "wrong-type", "typo", "region-without-queue"],
)
def test_run_refuses_a_mistake_in_one_line_naming_file_line_and_key(tmp_path: Path, body: str, expected: str):
    config = _config(tmp_path, body)

    result = runner.invoke(app, ["run", "--config", str(config)])

    assert result.exit_code == 2
    assert _lines(result.output) == [f"{config}:" + expected.format(stack=tmp_path / "stack.json")]


@pytest.mark.parametrize(
    ("run_as", "expected"),
    [
        (
            "relevo-nobody-here",
            "4: run_as: no user 'relevo-nobody-here' on this machine: create it first (docs/agent.md, \"A "
            'build user")',
        ),
        (
            "root",
            "4: run_as: 'root' is uid 0: a stage run as it could read everything the agent holds; name an "
            "unprivileged user",
        ),
    ],
    ids=["unknown-user", "root"],
)
def test_run_refuses_a_build_user_that_is_not_there_or_is_root(tmp_path: Path, run_as: str, expected: str):
    config = _config(tmp_path, f'region = "eu-west"\nrun_as = "{run_as}"\n')

    result = runner.invoke(app, ["run", "--config", str(config)])

    assert result.exit_code == 2
    assert _lines(result.output) == [f"{config}:{expected}"]
    doctor = runner.invoke(app, ["doctor", "--config", str(config)])
    assert doctor.exit_code == 1 and _lines(doctor.output) == [f"FAIL  config: {config}:{expected}"]


def test_run_refuses_a_build_user_the_agent_is_or_cannot_become(
    tmp_path: Path, build_user, shared_dir: Path, monkeypatch
):
    """Only root starts a command as another user; a build as the agent's own user reads what it holds."""
    import os
    import pwd

    config = _config(
        tmp_path,
        f'region = "eu-west"\nrun_as = "{build_user.name}"\nworkspace_root = "{shared_dir / "ws"}"\n',
    )
    nobody = pwd.getpwnam("nobody")
    refusals = {}
    for euid in (build_user.uid, nobody.pw_uid):
        monkeypatch.setattr(os, "geteuid", lambda euid=euid: euid)
        result = runner.invoke(app, ["run", "--config", str(config)])
        assert result.exit_code == 2
        [refusals[euid]] = _lines(result.output)

    assert refusals[build_user.uid] == (
        f"{config}:4: run_as: '{build_user.name}' is the user the agent runs as: its stages could read the "
        "agent's credentials, "
        "journal and config; name another user"
    )
    assert refusals[nobody.pw_uid] == (
        f"{config}:4: run_as: the agent runs as nobody (uid {nobody.pw_uid}), and only root can start a "
        f"stage as '{build_user.name}': "
        'run the agent as root (a LaunchDaemon: docs/agent.md, "A build user"), or remove run_as'
    )


def test_run_refuses_workspaces_the_build_user_cannot_reach(tmp_path: Path, build_user):
    """pytest's tmp_path is root's alone (drwx------ above it), as ~/relevo is under /var/root."""
    workspaces = tmp_path / "workspaces"
    config = _config(
        tmp_path, f'region = "eu-west"\nrun_as = "{build_user.name}"\nworkspace_root = "{workspaces}"\n'
    )

    result = runner.invoke(app, ["run", "--config", str(config)])

    assert result.exit_code == 2
    [line] = _lines(result.output)
    assert line.startswith(
        f"{config}:5: workspace_root: the build user '{build_user.name}' cannot reach {workspaces} (/"
    )
    assert line.endswith(
        " is drwx------ root): choose a workspace_root outside the agent's home, e.g. "
        "/Users/Shared/relevo/workspaces"
    )


def test_run_names_a_missing_stack_file_as_the_configs_mistake(tmp_path: Path):
    config = tmp_path / "agent.toml"
    config.write_text(f'region = "eu-west"\nstack_file = "{tmp_path / "gone.json"}"\n')

    result = runner.invoke(app, ["run", "--config", str(config)])

    assert result.exit_code == 2
    [line] = _lines(result.output)
    assert line.startswith(f"{config}:2: stack_file: no stack file at {tmp_path / 'gone.json'}")


def test_doctor_reports_a_broken_config_in_one_fail_line(tmp_path: Path):
    config = _config(tmp_path, 'region = "eu-west"\nmin_free_disk_gb = "lots"\n')

    result = runner.invoke(app, ["doctor", "--config", str(config)])

    assert result.exit_code == 1
    assert _lines(result.output) == [
        f"FAIL  config: {config}:4: min_free_disk_gb: Input should be a valid number, unable to parse "
        "string as a number (got 'lots')"
    ]


def test_doctor_names_the_stacks_regions_when_the_region_has_no_queue(tmp_path: Path):
    config = _config(tmp_path, 'region = "ap-south"\n')

    result = runner.invoke(app, ["doctor", "--config", str(config)])

    assert result.exit_code == 1
    assert "set stack_file or queue_url" not in result.output
    assert (
        f"FAIL  queue: no work queue for region 'ap-south' in the stack {tmp_path / 'stack.json'} "
        "(its region affinities: eu-west, us-east)"
    ) in result.output


def test_with_debug_run_lets_the_config_mistake_through(tmp_path: Path):
    config = _config(tmp_path, 'regoin = "eu-west"\n')

    result = runner.invoke(app, ["--debug", "run", "--config", str(config)])

    assert result.exit_code == 1
    assert "unknown key 'regoin'" in str(result.exception)


def test_run_refuses_workspaces_inside_a_git_work_tree(tmp_path: Path):
    """A stage's git (and a checkout's git clean) would act on that repository: the Relevo
    checkout of the person running a local agent, a dotfiles repository holding the home."""
    import subprocess

    repository = tmp_path / "someones-repo"
    subprocess.run(["git", "init", "--quiet", str(repository)], check=True)
    config = _config(
        tmp_path, f'region = "eu-west"\nworkspace_root = "{repository / ".relevo" / "workspaces"}"\n'
    )

    result = runner.invoke(app, ["run", "--config", str(config)])

    assert result.exit_code == 2
    assert _lines(result.output) == [
        f"{config}:4: workspace_root: {repository / '.relevo' / 'workspaces'} is inside the git work tree "
        f"{repository}: git in a "
        "stage, or the checkout's git clean, would act on that repository; choose a directory outside it"
    ]


def test_a_local_agents_workspaces_stay_out_of_a_checkout_and_its_paths_are_absolute(
    tmp_path: Path, monkeypatch
):
    """`relevo local agent` in a Relevo checkout (its state dir .relevo/local inside it): the
    workspaces go under the user's cache, and no path of the TOML is relative (the agent reads a
    relative one relative to the file: it came out doubled)."""
    import subprocess
    import tomllib

    from relevo_local.processes import write_agent_config

    checkout = tmp_path / "relevo"
    subprocess.run(["git", "init", "--quiet", str(checkout)], check=True)
    monkeypatch.chdir(checkout)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    home = Path(".relevo/local/agents/local-eu-west-1")
    home.mkdir(parents=True)
    stack = unreachable_stack_file(tmp_path)
    written = tomllib.loads(
        write_agent_config(home / "agent.toml", stack, "eu-west", "local-eu-west-1").read_text()
    )
    assert all(Path(written[key]).is_absolute() for key in ("workspace_root", "journal", "stack_file"))
    assert Path(written["workspace_root"]).is_relative_to(tmp_path / "cache" / "relevo")
    assert Path(written["journal"]) == (checkout / home / "local-eu-west-1-journal.sqlite3").resolve()
