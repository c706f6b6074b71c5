"""A deployed Relevo stack, found by its CloudFormation name: what `relevo stack use` writes and
`relevo stack show` checks. The same reader serves a stack in AWS and the local stack (created
through the emulator's CloudFormation, so `--endpoint-url` reaches it the same way)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from relevo_core.stackfile import StackInfo

# A stack whose resources are all there and settled (CloudFormation's stack status values).
USABLE = {"CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE", "IMPORT_COMPLETE", "IMPORT_ROLLBACK_COMPLETE"}
REQUIRED_OUTPUTS = ("ApiUrl", "TableName", "StateMachineArn", "ArtifactBucketName", "NotificationTopicArn")


class StackProblem(Exception):
    """The stack cannot be used, in words that say what to do."""


def session(region: str | None, profile: str | None) -> boto3.session.Session:
    return boto3.session.Session(region_name=region, profile_name=profile)


def _logical_suffix(region_affinity: str) -> str:
    """How Fn::ForEach's &{Region} turns an affinity into a logical-id suffix."""
    return re.sub(r"[^0-9a-zA-Z]+", "", region_affinity)


def read_stack(name: str, aws: boto3.session.Session, endpoint_url: str | None = None) -> StackInfo:
    """The stack file of the CloudFormation stack `name`, from its outputs and resources."""
    cloudformation = aws.client("cloudformation", endpoint_url=endpoint_url)
    try:
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except NoCredentialsError as exc:
        raise StackProblem("no AWS credentials: set AWS_PROFILE, pass --profile, or run `aws configure`") from exc
    except ClientError as exc:
        message = exc.response["Error"].get("Message", "")
        if "does not exist" in message:
            region = aws.region_name or "the default region"
            raise StackProblem(f"no stack named {name!r} in {region}: deploy it with `sam deploy --guided`, or pass --region") from exc
        raise StackProblem(f"cannot read stack {name!r}: {exc.response['Error'].get('Code')}: {message}") from exc
    except BotoCoreError as exc:
        raise StackProblem(f"cannot reach CloudFormation: {exc}") from exc
    stack = stacks[0]
    status = stack["StackStatus"]
    if status not in USABLE:
        hint = "wait for it to finish" if status.endswith("_IN_PROGRESS") else "see its events in the CloudFormation console, fix, and deploy again"
        raise StackProblem(f"stack {name!r} is {status}, not deployed: {hint}")
    outputs = {output["OutputKey"]: output["OutputValue"] for output in stack.get("Outputs", [])}
    missing = [key for key in REQUIRED_OUTPUTS if key not in outputs]
    if missing:
        raise StackProblem(f"stack {name!r} has no output {', '.join(missing)}: is it a Relevo stack, deployed from this version's template.yaml?")
    resources: dict[str, str | None] = {}
    for page in cloudformation.get_paginator("list_stack_resources").paginate(StackName=name):
        for summary in page["StackResourceSummaries"]:
            resources[summary["LogicalResourceId"]] = summary.get("PhysicalResourceId")
    prefix = f"{name}-work-"
    work_queues = {}
    for logical_id, url in resources.items():
        queue = str(url or "").rsplit("/", 1)[-1]
        if logical_id.startswith("WorkQueue") and queue.startswith(prefix) and not queue.endswith("-dlq"):
            work_queues[queue.removeprefix(prefix)] = str(url)
    if not work_queues:
        raise StackProblem(f"stack {name!r} has no work queue: its RegionAffinities parameter is empty")
    agent_roles = {
        region: outputs[f"AgentRoleArn{_logical_suffix(region)}"]
        for region in work_queues
        if f"AgentRoleArn{_logical_suffix(region)}" in outputs
    }
    return StackInfo(
        stack_name=name,
        aws_endpoint=endpoint_url,
        api_url=outputs["ApiUrl"],
        region=aws.region_name or stack["StackId"].split(":")[3],
        resources=dict(sorted(resources.items())),
        work_queues=dict(sorted(work_queues.items())),
        agent_roles=agent_roles,
    )


def write_stack_file(info: StackInfo, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info.model_dump(exclude_none=True), indent=2) + "\n")
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class Reachable:
    name: str
    ok: bool
    words: str


def check_reachable(info: StackInfo, aws: boto3.session.Session) -> list[Reachable]:
    """What `relevo stack show` checks: who the credentials are, that the table and the API
    answer them. Each check says what failed, not a traceback."""
    from relevo_cli.api import ApiError, RelevoApi

    checks = []
    endpoint = info.aws_endpoint
    try:
        identity = aws.client("sts", endpoint_url=endpoint).get_caller_identity()
        checks.append(Reachable("credentials", True, identity["Arn"]))
    except (ClientError, BotoCoreError) as exc:
        checks.append(Reachable("credentials", False, f"refused: {exc}"))
        return checks
    try:
        table = aws.client("dynamodb", endpoint_url=endpoint).describe_table(TableName=info.table_name)["Table"]
        checks.append(Reachable("table", True, f"{info.table_name} ({table['TableStatus']})"))
    except (ClientError, BotoCoreError) as exc:
        checks.append(Reachable("table", False, f"{info.table_name}: {_why(exc)}"))
    try:
        RelevoApi(info.api_url.rstrip("/"), info.region, aws).request("GET", "/projects")
        checks.append(Reachable("api", True, f"{info.api_url} answers"))
    except ApiError as exc:
        checks.append(Reachable("api", False, f"{info.api_url}: {exc}"))
    except Exception as exc:  # a connection refused or a DNS failure says as much
        checks.append(Reachable("api", False, f"{info.api_url}: {exc}"))
    return checks


def _why(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        error: dict[str, Any] = exc.response.get("Error", {})
        return f"{error.get('Code', 'error')}: {error.get('Message', '')}"
    return str(exc)
