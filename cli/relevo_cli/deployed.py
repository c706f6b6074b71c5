"""A deployed Relevo stack: `relevo stack show`'s checks that it can be reached (the stack is
found by relevo_core.stackfile.read_stack, which `relevo-agent init` uses too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from relevo_core.stackfile import StackInfo

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
