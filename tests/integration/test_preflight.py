"""`relevo aws preflight` checks an account read-only and says what to fix; against the
emulator for what it can answer, and the concurrency arithmetic on its own."""

from __future__ import annotations

import json
import secrets

from typer.testing import CliRunner

from relevo_cli.main import app
from relevo_cli.preflight import DeployPlan, concurrency_finding
from relevo_core.aws import client
from relevo_core.checks import Verdict

runner = CliRunner()

# Only reading: whatever preflight does must pass under this policy (the emulator enforces actions).
READ_ONLY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": ["sts:GetCallerIdentity", "*:Describe*", "*:Get*", "*:List*"],
            "Resource": "*",
        }
    ],
}


def _read_only_env(stack) -> dict[str, str]:
    iam = client("iam")
    name = f"relevo-preflight-{secrets.token_hex(3)}"
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="read-only", PolicyDocument=json.dumps(READ_ONLY))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {
        "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        "AWS_DEFAULT_REGION": stack.region,
    }


def _preflight(stack, *args: str, env: dict[str, str]):
    return runner.invoke(
        app,
        ["aws", "preflight", "--endpoint-url", str(stack.aws_endpoint), "--region", stack.region, *args],
        env=env,
    )


def test_preflight_reads_what_a_first_deploy_needs_with_read_only_credentials(local_stack):
    env = _read_only_env(local_stack)
    checked = _preflight(local_stack, "--stack-name", "relevo-new", env=env)
    assert checked.exit_code == 0, checked.output
    lines = checked.output.splitlines()
    assert any(line.startswith("ok    credentials: account 123456789012") for line in lines), checked.output
    assert "ok    stack: no stack relevo-new yet: sam deploy creates it" in lines
    assert any(
        line.startswith("ok    deployment bucket: sam deploy creates SAM's managed bucket") for line in lines
    )
    # The emulator has no Lambda GetAccountSettings: said so, not passed.
    assert any(line.startswith("??    lambda concurrency: could not read") for line in lines)
    assert "ok    api access logs: off (ApiAccessLogging=off): no account role needed" in lines
    assert "ok    Step Functions: available" in lines and "ok    EventBridge Scheduler: available" in lines

    existing = _preflight(local_stack, "--stack-name", local_stack.stack_name, env=env)
    assert (
        f"ok    stack: {local_stack.stack_name} exists (CREATE_COMPLETE): sam deploy updates it"
        in existing.output.splitlines()
    )


def test_preflight_names_what_to_fix(local_stack):
    env = _read_only_env(local_stack)
    logging = _preflight(local_stack, "--stack-name", "relevo-new", "--access-logging", env=env)
    assert logging.exit_code == 1
    assert (
        "FIX   api access logs: ApiAccessLogging=on needs the account's API Gateway CloudWatch role"
        in logging.output
    )

    from moto.cloudformation.models import cloudformation_backends

    client("cloudformation").create_stack(
        StackName="relevo-failed",
        TemplateBody=json.dumps(
            {
                "Resources": {
                    "Queue": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": "relevo-failed-q"}}
                }
            }
        ),
    )
    stack = next(
        s
        for s in cloudformation_backends["123456789012"][local_stack.region].stacks.values()
        if s.name == "relevo-failed"
    )
    stack.status = "ROLLBACK_COMPLETE"
    failed = _preflight(local_stack, "--stack-name", "relevo-failed", env=env)
    assert failed.exit_code == 1
    assert "delete it with `aws cloudformation delete-stack --stack-name relevo-failed`" in failed.output


def test_reserved_concurrency_must_leave_the_unreserved_floor():
    on = DeployPlan("relevo", reserved_concurrency=True, access_logging=False, reserved_total=148)
    # A fresh account's quota of 10: reserving is impossible.
    small = concurrency_finding(on, limit=10, unreserved=10)
    assert small.verdict is Verdict.FIX and "ReservedConcurrency=off" in small.words
    assert concurrency_finding(on, limit=1000, unreserved=1000).verdict is Verdict.OK
    assert concurrency_finding(on, limit=248, unreserved=247).verdict is Verdict.FIX  # one short of 148 + 100
    off = DeployPlan("relevo", reserved_concurrency=False, access_logging=False, reserved_total=148)
    assert concurrency_finding(off, limit=10, unreserved=10).verdict is Verdict.OK
