"""A deployed Relevo stack: `relevo stack show`'s checks that it can be reached (the stack is
found by relevo_core.files.stack.read_stack, which `relevo-agent init` uses too)."""

from __future__ import annotations

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from relevo_core.aws import error_words
from relevo_core.checks import Check, Verdict
from relevo_core.files.stack import StackInfo


def check_reachable(info: StackInfo, aws: boto3.session.Session) -> list[Check]:
    """What `relevo stack show` checks: who the credentials are, that the table and the API
    answer them. Each check says what failed, not a traceback."""
    from relevo_cli.api import ApiError, RelevoApi

    checks = []
    endpoint = info.aws_endpoint
    try:
        identity = aws.client("sts", endpoint_url=endpoint).get_caller_identity()
        checks.append(Check("credentials", Verdict.OK, identity["Arn"]))
    except (ClientError, BotoCoreError) as exc:
        checks.append(Check("credentials", Verdict.FAIL, f"refused: {exc}"))
        return checks
    try:
        table = aws.client("dynamodb", endpoint_url=endpoint).describe_table(TableName=info.table_name)[
            "Table"
        ]
        checks.append(Check("table", Verdict.OK, f"{info.table_name} ({table['TableStatus']})"))
    except (ClientError, BotoCoreError) as exc:
        checks.append(Check("table", Verdict.FAIL, f"{info.table_name}: {error_words(exc)}"))
    try:
        RelevoApi(info.api_url.rstrip("/"), info.region, aws).request("GET", "/projects")
        checks.append(Check("api", Verdict.OK, f"{info.api_url} answers"))
    except ApiError as exc:
        checks.append(Check("api", Verdict.FAIL, f"{info.api_url}: {exc}"))
    except Exception as exc:  # a connection refused or a DNS failure says as much
        checks.append(Check("api", Verdict.FAIL, f"{info.api_url}: {exc}"))
    return checks
