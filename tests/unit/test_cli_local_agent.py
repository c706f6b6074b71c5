"""`relevo local agent --label KEY=VALUE`: forcing placement on the local stack needs no
hand-written TOML. The command as typed (CliRunner), up to the moment it becomes the agent
(os.execv, recorded here); the stack it joins stands in for a running `relevo local up` (the same
command against a real one: tests/e2e/test_local_stack_commands.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from relevo_agent.config import AgentConfig
from relevo_cli.commands import local
from relevo_cli.main import app
from relevo_local.processes import write_agent_config

runner = CliRunner()


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    stack = SimpleNamespace(work_queues={"eu-west": "http://q/eu-west"}, api_url="http://127.0.0.1:1/v1")
    monkeypatch.setattr(local, "_running_stack", lambda state_dir: (SimpleNamespace(pid=1), stack))
    ran: list[list[str]] = []

    def execv(path: str, argv: list[str]) -> None:
        ran.append(argv)
        raise SystemExit(0)  # the CLI's process is the agent's from here

    monkeypatch.setattr(local.os, "execv", execv)
    return ran


def _toml(state_dir: Path, agent_id: str = "local-eu-west-1") -> dict[str, Any]:
    return tomllib.loads((state_dir / "agents" / agent_id / "agent.toml").read_text())


def test_labels_given_on_the_command_line_are_the_agents_labels(tmp_path: Path, execs: list[list[str]]):
    # Given a running local stack
    # When an agent is started with two labels (one standing in for a Mac's Xcode on this machine)
    result = runner.invoke(
        app,
        [
            "local",
            "agent",
            "--region",
            "eu-west",
            "--label",
            "bay=build",
            "--label",
            "xcode=16.2",
            "--state-dir",
            str(tmp_path),
        ],
    )

    # Then it became the agent, with a TOML whose labels are those, which the agent's config reads
    assert result.exit_code == 0 and len(execs) == 1, result.output
    assert "(region affinity eu-west, capacity 2, labels bay=build, xcode=16.2)" in result.stdout
    written = _toml(tmp_path)
    assert written["labels"] == {"bay": "build", "xcode": "16.2"}
    assert AgentConfig.model_validate(written).labels == {"bay": "build", "xcode": "16.2"}
    assert execs[0][-3:] == [
        "--config",
        str((tmp_path / "agents" / "local-eu-west-1" / "agent.toml").resolve()),
        "--follow-stack",
    ]


def test_without_labels_the_toml_has_none(tmp_path: Path, execs: list[list[str]]):
    result = runner.invoke(app, ["local", "agent", "--region", "eu-west", "--state-dir", str(tmp_path)])

    assert result.exit_code == 0 and len(execs) == 1, result.output
    assert "labels" not in _toml(tmp_path)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["bay"], "--label 'bay': give it as KEY=VALUE, e.g. --label bay=build"),
        (["bay="], "--label 'bay=': give it as KEY=VALUE, e.g. --label bay=build"),
        (
            ["Bay=build"],
            "--label 'Bay=build': 'Bay' is not a label key (a lowercase letter, then up to 31 of a-z, 0-9, "
            "_ and -)",
        ),
        (["bay=" + "x" * 65], "--label bay=…: its value is 65 characters, at most 64"),
        (["bay=build", "bay=sign"], "--label bay: given twice (bay=build and bay=sign)"),
    ],
)
def test_a_label_mistake_is_one_line_and_starts_nothing(
    tmp_path: Path, execs: list[list[str]], given: list[str], said: str
):
    # Given a label the agent's config would refuse
    # When the agent is asked for with it
    result = runner.invoke(
        app,
        [
            "local",
            "agent",
            "--region",
            "eu-west",
            *[arg for g in given for arg in ("--label", g)],
            "--state-dir",
            str(tmp_path),
        ],
    )

    # Then the command refuses it in one line (exit 2), and no agent is started, no TOML written
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == said
    assert execs == [] and not (tmp_path / "agents").exists()


def test_the_local_agents_allowed_skew_is_smaller_than_a_macs_and_the_docs_say_why(tmp_path: Path):
    # Given the TOML `relevo local agent` writes, and the default of a hand-written one
    local_skew = tomllib.loads(
        write_agent_config(tmp_path / "a.toml", tmp_path / "stack.json", "eu-west", "a").read_text()
    )["max_clock_skew_sec"]
    mac_skew = AgentConfig.model_fields["max_clock_skew_sec"].default

    # Then a real Mac keeps the safe default, the local stack's agents (one host, one clock) less,
    # and the agent's config page says both, with why
    assert (local_skew, mac_skew) == (1.0, 5.0)
    page = (Path(__file__).resolve().parents[2] / "docs" / "agent-config.md").read_text()
    section = page.split("## On the local stack", 1)[1].split("\n## ", 1)[0]
    assert f"`max_clock_skew_sec = {local_skew}`" in section and f"default, {mac_skew:g} s" in section
    assert "relevo local agent --region eu-west --label bay=build" in section
