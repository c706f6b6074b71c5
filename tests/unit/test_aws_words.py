"""The path to AWS in words: `relevo aws preflight` tells apart no credentials, credentials AWS
refused and an AWS it cannot reach; a profile that does not exist is one line, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ProfileNotFound
from typer.testing import CliRunner

from relevo_cli.main import app
from relevo_cli.preflight import credentials_finding
from relevo_core.checks import Verdict
from tests.helpers.stack_files import unreachable_stack_file

runner = CliRunner()


@pytest.mark.parametrize(
    "exc, says",
    [
        (
            NoCredentialsError(),
            "no AWS credentials found (not in the environment, ~/.aws or an SSO session): set AWS_PROFILE, "
            "or run `aws configure` or `aws sso login`",
        ),
        (
            ClientError(
                {
                    "Error": {
                        "Code": "InvalidClientTokenId",
                        "Message": "The security token included in the request is invalid.",
                    }
                },
                "GetCallerIdentity",
            ),
            "AWS refused them (InvalidClientTokenId: The security token included in the request is "
            "invalid.): they are wrong or expired; set AWS_PROFILE, or run `aws configure` (or `aws sso "
            "login` again)",
        ),
        (
            EndpointConnectionError(endpoint_url="https://sts.eu-west-1.amazonaws.com/"),
            "could not reach AWS (Could not connect to the endpoint URL: "
            '"https://sts.eu-west-1.amazonaws.com/"): offline, or a proxy or firewall in the way? Nothing '
            "was checked",
        ),
        (
            ProfileNotFound(profile="nosuch"),
            "The config profile (nosuch) could not be found: `aws configure list-profiles` lists the "
            "profiles there are; choose one with --profile or AWS_PROFILE",
        ),
    ],
    ids=["no credentials", "refused", "unreachable", "no such profile"],
)
def test_preflight_tells_the_credential_failures_apart(exc: BaseException, says: str):
    finding = credentials_finding(exc)
    assert (finding.verdict, finding.words) == (Verdict.FIX, says)


def test_no_credentials_at_all_is_said_so_by_preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    checked = runner.invoke(
        app, ["aws", "preflight", "--region", "eu-west-1", "--endpoint-url", "http://127.0.0.1:9"]
    )
    assert checked.exit_code == 1
    assert checked.output.splitlines() == [
        "FIX   credentials: no AWS credentials found (not in the environment, ~/.aws or an SSO "
        "session): set AWS_PROFILE, or run `aws configure` or `aws sso login`"
    ]


def test_a_profile_that_does_not_exist_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "nosuch")
    stack_file = unreachable_stack_file(tmp_path)
    shown = runner.invoke(app, ["jobs", "--stack-file", str(stack_file)])  # the spelling the issue used
    lines = [line for line in shown.output.splitlines() if line.strip()]
    assert shown.exit_code == 2 and "Traceback" not in shown.output
    assert lines == [
        "The config profile (nosuch) could not be found: `aws configure list-profiles` lists the profiles "
        "there are; "
        "set AWS_PROFILE to one of them (or unset it)"
    ], shown.output
