"""`relevo aws preflight`: what a first `sam deploy` of Relevo needs in an account and region,
checked read-only before anything is created, each finding with what to fix.

Nothing here writes: every call is a Describe/Get/List. A check the endpoint cannot answer (the
emulator implements no Lambda GetAccountSettings) says it could not check, never "ok"."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from relevo_core.aws import error_words
from relevo_core.checks import Check, Verdict
from relevo_core.files.stack import USABLE

# Lambda keeps this much of a region's concurrency unreserved ("Configuring reserved concurrency
# for a function", AWS Lambda Developer Guide: you can reserve up to the account's concurrency
# limit minus 100).
UNRESERVED_FLOOR = 100
# The bucket `sam deploy` uploads to when samconfig.toml says resolve_s3 (SAM CLI's own stack).
SAM_MANAGED_STACK = "aws-sam-cli-managed-default"


@dataclass(frozen=True)
class DeployPlan:
    """What the deploy asks for, from samconfig.toml's parameter overrides and the template."""

    stack_name: str
    reserved_concurrency: bool
    access_logging: bool
    reserved_total: int


def _overrides(text: str) -> dict[str, str]:
    import shlex

    pairs = {}
    for token in shlex.split(text):
        name, _, value = token.partition("=")
        pairs[name] = value
    return pairs


def reserved_total(template: dict[str, Any]) -> int:
    """The concurrency the template reserves when ReservedConcurrency is on: each function's
    `!If [ReserveConcurrency, N, AWS::NoValue]`."""
    total = 0
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        reserved = resource.get("Properties", {}).get("ReservedConcurrentExecutions")
        if isinstance(reserved, dict) and "Fn::If" in reserved:
            reserved = reserved["Fn::If"][1]
        if isinstance(reserved, int):
            total += reserved
    return total


def deploy_plan(
    root: Path, stack_name: str | None, reserved: bool | None, logging: bool | None
) -> DeployPlan:
    from relevo_local.template import load_sam_template

    samconfig = (
        tomllib.loads((root / "samconfig.toml").read_text()) if (root / "samconfig.toml").is_file() else {}
    )
    default = samconfig.get("default", {})
    deploy = default.get("deploy", {}).get("parameters", {})
    overrides = _overrides(str(deploy.get("parameter_overrides", "")))
    name = stack_name or default.get("global", {}).get("parameters", {}).get("stack_name") or "relevo"
    return DeployPlan(
        stack_name=name,
        reserved_concurrency=reserved
        if reserved is not None
        else overrides.get("ReservedConcurrency", "off") == "on",
        access_logging=logging if logging is not None else overrides.get("ApiAccessLogging", "off") == "on",
        reserved_total=reserved_total(load_sam_template(root / "template.yaml")),
    )


def credentials_finding(exc: BaseException, endpoint_url: str | None = None) -> Check:
    """Why the first call (STS GetCallerIdentity) failed, told apart: no credentials to sign with,
    credentials AWS refused, or no answer at all (offline, a proxy, a wrong endpoint). Nothing else
    was checked then."""
    if isinstance(exc, ProfileNotFound):
        return Check(
            "credentials",
            Verdict.FIX,
            f"{exc}: `aws configure list-profiles` lists the profiles there are; "
            "choose one with --profile or AWS_PROFILE",
        )
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return Check(
            "credentials",
            Verdict.FIX,
            "no AWS credentials found (not in the environment, ~/.aws or an SSO "
            "session): set AWS_PROFILE, or run `aws configure` or `aws sso login`",
        )
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        where = endpoint_url or "AWS"
        return Check(
            "credentials",
            Verdict.FIX,
            f"could not reach {where} ({exc}): offline, or a proxy or firewall in "
            "the way? Nothing was checked",
        )
    if isinstance(exc, ClientError):
        return Check(
            "credentials",
            Verdict.FIX,
            f"AWS refused them ({error_words(exc)}): they are wrong or expired; set "
            "AWS_PROFILE, or run `aws configure` (or `aws sso login` again)",
        )
    return Check("credentials", Verdict.FIX, f"could not check them ({error_words(exc)})")


def concurrency_finding(plan: DeployPlan, limit: int, unreserved: int) -> Check:
    if not plan.reserved_concurrency:
        return Check(
            "lambda concurrency",
            Verdict.OK,
            f"nothing reserved (ReservedConcurrency=off); the region's limit is {limit}",
        )
    left = unreserved - plan.reserved_total
    if left >= UNRESERVED_FLOOR:
        return Check(
            "lambda concurrency",
            Verdict.OK,
            f"reserving {plan.reserved_total} of {unreserved} unreserved leaves {left} (≥ "
            f"{UNRESERVED_FLOOR})",
        )
    return Check(
        "lambda concurrency",
        Verdict.FIX,
        f"reserving {plan.reserved_total} of {unreserved} unreserved (limit {limit}) would leave {left}, "
        f"below the {UNRESERVED_FLOOR} Lambda "
        "keeps unreserved: deploy with ReservedConcurrency=off, or ask Service Quotas for a higher "
        "'Concurrent executions' limit",
    )


def preflight(plan: DeployPlan, aws: boto3.session.Session, endpoint_url: str | None = None) -> list[Check]:
    def call(service: str, operation: str, **kwargs: Any) -> Any:
        # boto3-stubs type client() per literal service name.
        made = aws.client(service, endpoint_url=endpoint_url)  # type: ignore[call-overload]  # any service
        return getattr(made, operation)(**kwargs)

    findings: list[Check] = []
    try:
        identity = call("sts", "get_caller_identity")
    except (ClientError, BotoCoreError) as exc:
        return [credentials_finding(exc, endpoint_url)]
    findings.append(Check("credentials", Verdict.OK, f"account {identity['Account']} as {identity['Arn']}"))

    try:
        stack = call("cloudformation", "describe_stacks", StackName=plan.stack_name)["Stacks"][0]
        status = stack["StackStatus"]
        if status in USABLE:
            findings.append(
                Check("stack", Verdict.OK, f"{plan.stack_name} exists ({status}): sam deploy updates it")
            )
        elif status == "ROLLBACK_COMPLETE":
            findings.append(
                Check(
                    "stack",
                    Verdict.FIX,
                    f"{plan.stack_name} is ROLLBACK_COMPLETE (its first deploy failed): delete it with `aws "
                    f"cloudformation delete-stack --stack-name {plan.stack_name}`, then deploy",
                )
            )
        else:
            findings.append(
                Check("stack", Verdict.FIX, f"{plan.stack_name} is {status}: wait for it to settle")
            )
    except ClientError as exc:
        if "does not exist" in exc.response["Error"].get("Message", ""):
            findings.append(
                Check("stack", Verdict.OK, f"no stack {plan.stack_name} yet: sam deploy creates it")
            )
        else:
            findings.append(Check("stack", Verdict.UNKNOWN, f"could not check ({error_words(exc)})"))

    try:
        call("cloudformation", "describe_stacks", StackName=SAM_MANAGED_STACK)
        findings.append(
            Check(
                "deployment bucket",
                Verdict.OK,
                f"SAM's managed stack {SAM_MANAGED_STACK} exists (resolve_s3)",
            )
        )
    except ClientError as exc:
        if "does not exist" in exc.response["Error"].get("Message", ""):
            findings.append(
                Check(
                    "deployment bucket",
                    Verdict.OK,
                    f"sam deploy creates SAM's managed bucket ({SAM_MANAGED_STACK}; needs s3:CreateBucket)",
                )
            )
        else:
            findings.append(
                Check("deployment bucket", Verdict.UNKNOWN, f"could not check ({error_words(exc)})")
            )

    try:
        settings = call("lambda", "get_account_settings")
        findings.append(
            concurrency_finding(
                plan,
                int(settings["AccountLimit"]["ConcurrentExecutions"]),
                int(settings["AccountLimit"]["UnreservedConcurrentExecutions"]),
            )
        )
    except (ClientError, BotoCoreError, KeyError) as exc:
        findings.append(
            Check(
                "lambda concurrency",
                Verdict.UNKNOWN,
                f"could not read the account's Lambda settings ({error_words(exc)})",
            )
        )

    if plan.access_logging:
        try:
            role = call("apigateway", "get_account").get("cloudwatchRoleArn")
            if role:
                findings.append(
                    Check(
                        "api access logs", Verdict.OK, f"the account's API Gateway CloudWatch role is {role}"
                    )
                )
            else:
                findings.append(
                    Check(
                        "api access logs",
                        Verdict.FIX,
                        "ApiAccessLogging=on needs the account's API Gateway CloudWatch role in this region "
                        "(docs/operations.md, 'Deploy to AWS'): set it, or deploy with ApiAccessLogging=off",
                    )
                )
        except (ClientError, BotoCoreError) as exc:
            findings.append(
                Check(
                    "api access logs",
                    Verdict.UNKNOWN,
                    f"could not read API Gateway's account settings ({error_words(exc)})",
                )
            )
    else:
        findings.append(
            Check("api access logs", Verdict.OK, "off (ApiAccessLogging=off): no account role needed")
        )

    for service, operation, kwargs, what in (
        ("stepfunctions", "list_state_machines", {"maxResults": 1}, "Step Functions"),
        ("scheduler", "list_schedule_groups", {"MaxResults": 1}, "EventBridge Scheduler"),
    ):
        try:
            call(service, operation, **kwargs)
            findings.append(Check(what, Verdict.OK, "available"))
        except (ClientError, BotoCoreError) as exc:
            findings.append(
                Check(
                    what,
                    Verdict.FIX,
                    f"not available to these credentials in this region ({error_words(exc)})",
                )
            )
    return findings
