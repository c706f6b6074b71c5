"""`relevo-agent doctor` against the local stack: all green when it is reachable, plain words and
a non-zero exit when something is wrong."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from relevo_agent.cli import app


def _config(tmp_path: Path, stack, **extra: str) -> Path:
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(stack.model_dump_json())
    lines = ['region = "eu-west"', f'stack_file = "{stack_file}"', f'workspace_root = "{tmp_path / "ws"}"']
    lines += [f"{name} = {value}" for name, value in extra.items()]
    path = tmp_path / "agent.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_doctor_passes_against_a_reachable_stack(local_stack, tmp_path: Path):
    result = CliRunner().invoke(
        app, ["doctor", "--config", str(_config(tmp_path, local_stack, min_free_disk_gb="0"))]
    )
    assert result.exit_code == 0, result.output
    for name in ("credentials", "permissions", "clock", "table", "queue", "disk", "journal"):
        assert f"ok    {name}:" in result.output
    # The stack file gives the agent a session of its region's agent role, and doctor says so.
    assert (
        ":assumed-role/relevo-AgentRoleeuwest" in result.output
        and "they are the agent role of eu-west" in result.output
    )
    assert "all checks passed" in result.output


def test_doctor_names_an_unreachable_queue_and_low_disk_space(local_stack, tmp_path: Path):
    # Given a region without a work queue in the stack, and a disk requirement no disk meets
    config = _config(tmp_path, local_stack, min_free_disk_gb="1000000")
    config.write_text(config.read_text().replace('region = "eu-west"', 'region = "mars-north"'))
    result = CliRunner().invoke(app, ["doctor", "--config", str(config)])
    assert result.exit_code == 1
    assert "FAIL  queue: no work queue for region 'mars-north'" in result.output
    assert "FAIL  disk: only" in result.output
    assert "2 problem(s): queue, disk" in result.output


def test_doctor_reports_a_queue_it_cannot_reach(local_stack, tmp_path: Path):
    config = tmp_path / "agent.toml"
    config.write_text(
        f'region = "eu-west"\ntable_name = "{local_stack.table_name}"\n'
        f'queue_url = "{local_stack.work_queues["eu-west"]}-gone"\nmin_free_disk_gb = 0\n'
    )
    result = CliRunner().invoke(app, ["doctor", "--config", str(config)])
    assert result.exit_code == 1
    assert "FAIL  queue: cannot reach the work queue" in result.output
    assert "ok    table:" in result.output
