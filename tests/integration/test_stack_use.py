"""`relevo stack use NAME` finds a deployed stack through CloudFormation alone, here the local
stack's (created through the emulator's CloudFormation), and `relevo stack show` checks it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_cli.main import app
from relevo_core.aws import client

runner = CliRunner()


def _env(emulator) -> dict[str, str]:
    """Only what a user of a deployed stack has: credentials and a region; no stack file."""
    return {
        "AWS_ACCESS_KEY_ID": emulator.credentials.access_key,
        "AWS_SECRET_ACCESS_KEY": emulator.credentials.secret_key,
        "AWS_DEFAULT_REGION": emulator.info.region,
        "RELEVO_STACK_FILE": "",
    }


def test_stack_use_writes_the_stack_file_the_tools_read(
    emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    local = emulator.info
    written = tmp_path / "stack.json"
    used = runner.invoke(
        app,
        [
            "stack",
            "use",
            local.stack_name,
            "--endpoint-url",
            str(local.aws_endpoint),
            "--region",
            local.region,
            "-o",
            str(written),
        ],
        env=_env(emulator),
    )
    assert used.exit_code == 0, used.output
    found = json.loads(written.read_text())
    # Everything the CLI and agents read, as `local up` itself wrote it.
    assert found["api_url"] == local.api_url
    assert found["work_queues"] == local.work_queues
    assert found["resources"]["Table"] == local.table_name
    assert found["resources"]["JobStateMachine"] == local.state_machine_arn
    assert (
        "local_credentials" not in found
    )  # CloudFormation knows no secrets; the user's own credentials apply

    shown = runner.invoke(app, ["stack", "show", "--stack-file", str(written)], env=_env(emulator))
    assert shown.exit_code == 0, shown.output
    assert (
        "ok    credentials" in shown.output and "ok    table" in shown.output and "ok    api" in shown.output
    )

    # The CLI then works through it.
    listed = runner.invoke(app, ["project", "list", "--stack-file", str(written)], env=_env(emulator))
    assert listed.exit_code == 0, listed.output


def test_a_stack_that_does_not_exist_is_one_clear_line(emulator, tmp_path: Path):
    local = emulator.info
    missing = runner.invoke(
        app,
        [
            "stack",
            "use",
            "no-such-stack",
            "--endpoint-url",
            str(local.aws_endpoint),
            "--region",
            local.region,
            "-o",
            str(tmp_path / "s.json"),
        ],
        env=_env(emulator),
    )
    assert missing.exit_code == 2
    assert "no stack named 'no-such-stack'" in missing.output and "sam deploy --guided" in missing.output
    assert "Traceback" not in missing.output
    assert not (tmp_path / "s.json").exists()


def test_a_stack_that_is_not_relevo_or_not_deployed_says_so(emulator, tmp_path: Path):
    local = emulator.info
    cloudformation = client("cloudformation")
    cloudformation.create_stack(
        StackName="not-relevo",
        TemplateBody=json.dumps(
            {"Resources": {"Queue": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": "not-relevo-q"}}}}
        ),
    )
    args = [
        "stack",
        "use",
        "not-relevo",
        "--endpoint-url",
        str(local.aws_endpoint),
        "--region",
        local.region,
        "-o",
        str(tmp_path / "s.json"),
    ]
    other = runner.invoke(app, args, env=_env(emulator))
    assert other.exit_code == 2 and "has no output ApiUrl" in other.output, other.output

    # A stack whose deploy failed (the emulator's record of it set as CloudFormation would).
    from moto.cloudformation.models import cloudformation_backends

    stack = next(
        s
        for s in cloudformation_backends["123456789012"][local.region].stacks.values()
        if s.name == "not-relevo"
    )
    stack.status = "ROLLBACK_COMPLETE"
    failed = runner.invoke(app, args, env=_env(emulator))
    assert failed.exit_code == 2 and "is ROLLBACK_COMPLETE, not deployed" in failed.output, failed.output
    stack.status = "UPDATE_IN_PROGRESS"
    busy = runner.invoke(app, args, env=_env(emulator))
    assert busy.exit_code == 2 and "wait for it to finish" in busy.output, busy.output
