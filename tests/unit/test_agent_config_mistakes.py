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
        ('region = "eu-west"\ncapacity = "two"\n', "4: capacity: Input should be a valid integer, unable to parse string as an integer (got 'two')"),
        ('regoin = "eu-west"\n', "3: unknown key 'regoin' (did you mean 'region'?)"),
        # stack_file is set: the stack's regions are named, not "set stack_file or queue_url"
        ('region = "ap-south"\n', "3: region: no work queue for region 'ap-south' in the stack {stack} (its region affinities: eu-west, us-east)"),
    ],
    ids=["toml-syntax", "wrong-type", "typo", "region-without-queue"],
)
def test_run_refuses_a_mistake_in_one_line_naming_file_line_and_key(tmp_path: Path, body: str, expected: str):
    config = _config(tmp_path, body)

    result = runner.invoke(app, ["run", "--config", str(config)])

    assert result.exit_code == 2
    assert _lines(result.output) == [f"{config}:" + expected.format(stack=tmp_path / "stack.json")]


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
        f"FAIL  config: {config}:4: min_free_disk_gb: Input should be a valid number, unable to parse string as a number (got 'lots')"
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
