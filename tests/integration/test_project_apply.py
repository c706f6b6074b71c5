"""`relevo project apply` refuses early and writes nothing it cannot keep: a region affinity the
stack has no work queue for is refused before any write, naming the regions there are; a project
the API refuses leaves no secret behind (a secret the apply created is deleted, one it changed
gets its previous value back)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from relevo_cli.main import app
from relevo_cli.projects import secret_name
from relevo_core.aws import client
from tests.helpers.stack import table_items

runner = CliRunner()


def _files(local_stack, tmp_path: Path, project_id: str, **fields: str) -> tuple[Path, str]:
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(local_stack.model_dump()))
    lines = {
        "id": project_id,
        "repo": f"acme/{project_id}",
        "region_affinity": "eu-west",
        **fields,
    }
    text = "".join(f"{key}: {value}\n" for key, value in lines.items())
    text += "stages:\n  - name: build\n    run: make\nwebhook:\n  github_secret_env: HELLO_WEBHOOK_SECRET\n"
    path = tmp_path / "project.yaml"
    path.write_text(text)
    return path, str(stack_file)


def _secret_value(name: str) -> str | None:
    try:
        return client("secretsmanager").get_secret_value(SecretId=name)["SecretString"]
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "ResourceNotFoundException":
            return None
        raise


@pytest.fixture(autouse=True)
def webhook_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    value = secrets.token_urlsafe(16)
    monkeypatch.setenv("HELLO_WEBHOOK_SECRET", value)
    return value


def test_a_region_without_a_work_queue_is_refused_before_anything_is_written(
    local_stack, project_id, tmp_path: Path
):
    path, stack_file = _files(local_stack, tmp_path, project_id, region_affinity="ap-south")

    result = runner.invoke(app, ["project", "apply", str(path), "--stack-file", stack_file])

    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"{path}:3: region_affinity: 'ap-south' has no work queue in this stack; "
        "its region affinities: eu-west, us-east (the stack's RegionAffinities)"
    )
    assert _secret_value(secret_name(local_stack, project_id, "github")) is None
    assert table_items(local_stack, f"PROJECT#{project_id}") == []


def _refused_by_the_api(local_stack, tmp_path: Path) -> tuple[str, Path, str]:
    """A project valid as a file that the API refuses, whoever applies it: with a 60-character id,
    its schedule's EventBridge Scheduler name (<project>--<schedule>) is over 64 characters."""
    project_id = "p" + secrets.token_hex(4) + "x" * 51
    path, stack_file = _files(local_stack, tmp_path, project_id)
    path.write_text(path.read_text() + "schedules:\n  - name: nightly-build\n    expression: rate(1 day)\n")
    return project_id, path, stack_file


def test_a_project_the_api_refuses_leaves_no_secret_it_created(local_stack, tmp_path: Path):
    project_id, path, stack_file = _refused_by_the_api(local_stack, tmp_path)

    result = runner.invoke(app, ["project", "apply", str(path), "--stack-file", stack_file])

    assert result.exit_code == 1, result.output
    assert "VALIDATION_FAILED" in result.output
    assert _secret_value(secret_name(local_stack, project_id, "github")) is None
    assert table_items(local_stack, f"PROJECT#{project_id}") == []


def test_a_refused_apply_gives_a_secret_it_changed_its_previous_value_back(
    local_stack, tmp_path: Path, webhook_secret
):
    # Given the project's webhook secret as an earlier apply stored it
    project_id, path, stack_file = _refused_by_the_api(local_stack, tmp_path)
    name = secret_name(local_stack, project_id, "github")
    client("secretsmanager").create_secret(Name=name, SecretString="the-earlier-secret")

    result = runner.invoke(app, ["project", "apply", str(path), "--stack-file", stack_file])

    # Then the API refuses it, and the secret holds its earlier value again
    assert result.exit_code == 1, result.output
    assert "VALIDATION_FAILED" in result.output
    assert _secret_value(name) == "the-earlier-secret"


def test_an_accepted_apply_stores_the_secret_and_the_reference(
    local_stack, project_id, tmp_path: Path, webhook_secret
):
    path, stack_file = _files(local_stack, tmp_path, project_id)

    result = runner.invoke(app, ["project", "apply", str(path), "--stack-file", stack_file])

    assert result.exit_code == 0, result.output
    name = secret_name(local_stack, project_id, "github")
    assert _secret_value(name) == webhook_secret
    shown = runner.invoke(app, ["project", "show", project_id, "--stack-file", stack_file])
    assert json.loads(shown.output)["webhook"]["github_secret_ref"] == name


def test_a_stage_of_more_shards_at_once_than_step_functions_runs_is_refused_at_apply_saying_how_it_could_run(
    local_stack,
    project_id,
    tmp_path: Path,
):
    """An inline Map runs at most 40 iterations at once ("Using Map state in Inline mode"), and a
    stage's shards are one (job.asl.json: RunShards): 41 or more without max_parallel would
    silently wait on AWS, where the emulator runs them all. Refused at apply (PLAN_TOO_LARGE); the
    same stage with max_parallel: 40 is applied."""
    # Given: a project file with a stage of 41 shards and no max_parallel
    path, stack_file = _files(local_stack, tmp_path, project_id)
    path.write_text(
        path.read_text().replace(
            "  - name: build\n    run: make\n", "  - name: test\n    run: make test\n    parallel: 41\n"
        )
    )

    # When: it is applied
    result = runner.invoke(app, ["project", "apply", str(path), "--stack-file", stack_file])

    # Then: refused, saying the limit and the ways that fit, and nothing stored
    assert result.exit_code == 1, result.output
    output = " ".join(result.output.split())
    assert "PLAN_TOO_LARGE" in output
    assert (
        "stages.0 (test): 41 shards and no max_parallel, which would run them all at once; at most 40 of a "
        "stage's shards run at once" in output
    )
    assert "set max_parallel to 40 or less" in output and "split the stage" in output
    assert table_items(local_stack, f"PROJECT#{project_id}") == []

    # And: with max_parallel 40 it is applied
    path.write_text(
        path.read_text().replace("    parallel: 41\n", "    parallel: 41\n    max_parallel: 40\n")
    )
    result = runner.invoke(app, ["project", "apply", str(path), "--stack-file", stack_file])
    assert result.exit_code == 0, result.output
