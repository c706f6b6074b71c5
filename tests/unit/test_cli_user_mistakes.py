"""A person's mistakes in `relevo` (a project file, an id): one line that names the file, the line
and the field, exit 2, no traceback unless --debug. Nothing here reaches a stack: each mistake is
found before the CLI would call one (the stack file points at a port nothing listens on)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_cli.main import app
from tests.helpers.stack_files import unreachable_stack_file

runner = CliRunner()

GOOD = """\
id: hello
repo: acme/hello
region_affinity: eu-west
stages:
  - name: build
    run: make
"""


@pytest.fixture()
def stack_file(tmp_path: Path) -> str:
    return str(unreachable_stack_file(tmp_path))


def _apply(tmp_path: Path, stack_file: str, content: str | bytes, *extra: str):
    path = tmp_path / "hello.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path, runner.invoke(app, [*extra, "project", "apply", str(path), "--stack-file", stack_file])


def _one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "Traceback" not in result.output, result.output
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path, stack_file: str):
    path, result = _apply(tmp_path, stack_file, GOOD.replace("    run: make", "    run: make: twice"))

    assert result.exit_code == 2
    assert _one_line(result) == f"{path}:6:14: YAML syntax: mapping values are not allowed here"


def test_a_missing_project_file_is_named(tmp_path: Path, stack_file: str):
    result = runner.invoke(app, ["project", "apply", str(tmp_path / "nope.yaml"), "--stack-file", stack_file])

    assert result.exit_code == 2
    assert _one_line(result) == f"{tmp_path / 'nope.yaml'}: no such project file"


def test_a_directory_is_not_a_project_file(tmp_path: Path, stack_file: str):
    result = runner.invoke(app, ["project", "apply", str(tmp_path), "--stack-file", stack_file])

    assert result.exit_code == 2
    assert _one_line(result) == f"{tmp_path}: is a directory, not a project file"


def test_a_file_that_is_not_utf8_names_the_file_and_line(tmp_path: Path, stack_file: str):
    path, result = _apply(tmp_path, stack_file, GOOD.replace("make", "caf\u00e9").encode("latin-1"))

    assert result.exit_code == 2
    assert _one_line(result) == f"{path}:6:13: not UTF-8 text (byte 0xe9); save the file as UTF-8"


def test_a_typo_in_a_key_says_did_you_mean_and_nothing_else(tmp_path: Path, stack_file: str):
    path, result = _apply(tmp_path, stack_file, GOOD.replace("stages:", "stage:"))

    assert result.exit_code == 2
    # Not also "stages: required": that is the typo's side effect, not a second mistake.
    assert _one_line(result) == f"{path}:4: unknown key 'stage' (did you mean 'stages'?)"


def test_a_typo_in_a_nested_key_names_where_it_is(tmp_path: Path, stack_file: str):
    path, result = _apply(tmp_path, stack_file, GOOD.replace("    run: make", "    rnu: make"))

    assert result.exit_code == 2
    assert _one_line(result) == f"{path}:6: stages[0]: unknown key 'rnu' (did you mean 'run'?)"


def test_a_value_of_the_wrong_type_names_its_line_and_field(tmp_path: Path, stack_file: str):
    path, result = _apply(tmp_path, stack_file, GOOD + "    exec_timeout_sec: ten minutes\n")

    assert result.exit_code == 2
    assert _one_line(result) == (
        f"{path}:7: stages[0].exec_timeout_sec: Input should be a valid integer, unable to parse string as "
        "an integer "
        "(got 'ten minutes')"
    )


def test_a_missing_required_key_names_the_mapping_that_lacks_it(tmp_path: Path, stack_file: str):
    path, result = _apply(tmp_path, stack_file, GOOD.replace("repo: acme/hello\n", ""))

    assert result.exit_code == 2
    assert _one_line(result) == f"{path}:1: repo: required, but not set"


def test_a_document_that_is_not_a_mapping_is_refused_in_a_sentence(tmp_path: Path, stack_file: str):
    path, result = _apply(tmp_path, stack_file, "- just\n- a list\n")

    assert result.exit_code == 2
    assert (
        _one_line(result) == f"{path}:1: a project file is a YAML mapping of keys (id:, repo:, stages:, ...)"
    )


def test_with_debug_the_mistake_comes_with_its_traceback(tmp_path: Path, stack_file: str):
    _, result = _apply(tmp_path, stack_file, GOOD.replace("stages:", "stage:"), "--debug")

    # The exception comes through (CliRunner keeps it; a terminal shows its traceback).
    assert result.exit_code == 1
    assert "unknown key 'stage'" in str(result.exception)


@pytest.mark.parametrize(
    "command",
    [
        ["status", "job-123"],
        ["logs", "JOB_1"],
        ["approve", "job_ab/cd"],
        ["cancel", "12345"],
        ["rerun", "job_short"],
    ],
)
def test_a_malformed_job_id_is_refused_before_any_call(stack_file: str, command: list[str]):
    result = runner.invoke(app, [*command, "--stack-file", stack_file])

    assert result.exit_code == 2
    assert (
        _one_line(result)
        == f"{command[1]!r} is not a job id (job ids look like job_00mx2h2r7n38p1566llawdrdc6)"
    )


def test_a_malformed_project_id_is_refused_before_any_call(stack_file: str):
    result = runner.invoke(app, ["run", "My_App", "--stack-file", stack_file])

    assert result.exit_code == 2
    assert (
        _one_line(result)
        == "'My_App' is not a project id (project ids look like ios-app: lowercase letters, digits and '-')"
    )


def test_a_stack_that_is_not_running_is_one_line(stack_file: str):
    result = runner.invoke(app, ["status", "job_00mx2h2r7n38p1566llawdrdc6", "--stack-file", stack_file])

    assert result.exit_code == 1
    assert _one_line(result).startswith(
        "cannot reach http://127.0.0.1:9/v1/jobs/job_00mx2h2r7n38p1566llawdrdc6: is the stack running?"
    )


def test_a_handoff_path_that_escapes_the_workspace_is_one_line_naming_its_own_line(
    tmp_path: Path, stack_file: str
):
    content = GOOD + "    handoff:\n      - build/App.app\n      - ../../Library/Keychains\n"
    path, result = _apply(tmp_path, stack_file, content)

    assert result.exit_code == 2
    assert _one_line(result) == (
        f"{path}:9: stages[0].handoff[1]: '../../Library/Keychains' climbs out with '..': handoff paths "
        "stay inside the workspace"
        " (got '../../Library/Keychains')"
    )


def test_a_checkout_url_with_credentials_in_it_is_refused(tmp_path: Path, stack_file: str):
    content = GOOD + "checkout:\n  url: https://x-access-token:ghp_secret@github.com/acme/hello.git\n"
    path, result = _apply(tmp_path, stack_file, content)

    assert result.exit_code == 2
    line = _one_line(result)
    assert line.startswith(f"{path}:8: checkout.url: ") and "put them in Secrets Manager" in line


def test_a_lease_no_agent_would_take_is_refused_with_the_arithmetic(tmp_path: Path, stack_file: str):
    """An agent renews every lease/3 and fences itself max_clock_skew_sec (5 s by default) before
    the lease ends: a lease of 6 s would fence at 1 s, before its first renewal at 2 s, so every
    agent would hand the stage back until the queue timeout. Refused before anything is written."""
    path, result = _apply(tmp_path, stack_file, GOOD + "lease_ttl_sec: 6\n")

    assert result.exit_code == 2
    assert _one_line(result) == (
        f"{path}:7: lease_ttl_sec: a lease of 6 s leaves no renewal before the fence: an agent renews every "
        "2 s "
        "(lease/3) and fences itself 5 s before the lease ends (the default max_clock_skew_sec), at 1 s; "
        "no agent with the default allowed skew would take a stage: use 8 s or more"
    )


def test_the_shortest_lease_an_agent_takes_is_accepted(tmp_path: Path, stack_file: str):
    # 8 s: renewals every 2.67 s, the fence at 3 s. The file passes; the unreachable stack is next.
    _, result = _apply(tmp_path, stack_file, GOOD + "lease_ttl_sec: 8\n")
    assert "lease_ttl_sec" not in result.output and "cannot reach" in result.output, result.output


def test_an_exit_code_both_a_warning_and_transient_is_refused(tmp_path: Path, stack_file: str):
    content = GOOD + "    warning_exit_codes: [3, 75]\n"
    path, result = _apply(tmp_path, stack_file, content)
    assert result.exit_code == 2
    assert _one_line(result).endswith(
        "stages[0].warning_exit_codes: 75 also in retry.transient_exit_codes: an exit code is either a "
        "warning "
        "(the job goes on) or transient (the stage is retried)"
    )
