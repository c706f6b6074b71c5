"""Calls made as a given identity, as AWS sees them: a client for a role session's or an agent's
credentials, the error code a refused call gives, and the API called as an IAM user."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.aws import client

ACCOUNT = "123456789012"


def client_as(stack, service: str, access_key: str, secret_key: str, token: str | None) -> Any:
    """A client of the stack's emulator that signs with these credentials only."""
    return boto3.client(
        service,
        endpoint_url=stack.aws_endpoint,
        region_name=stack.region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        aws_session_token=token,
    )


def refusal_code(call: Callable[[], Any]) -> str:
    """The error code of a call that must be refused (the test fails if it is not)."""
    with pytest.raises(ClientError) as refused:
        call()
    return refused.value.response["Error"]["Code"]


@dataclass
class Caller:
    arn: str
    api: RelevoApi

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            return 200, self.api.request(method, path, body)
        except ApiError as exc:
            return exc.status, exc.body


def api_as(stack, credentials: dict[str, str]) -> RelevoApi:
    session = boto3.session.Session(region_name=stack.region, **credentials)
    return RelevoApi(stack.api_url.rstrip("/"), stack.region, session)


# (stack endpoint, user name) -> its caller: IAM allows 2 access keys per user, and the admin
# user is shared by every test module of a worker that needs it.
_CALLERS: dict[tuple[str, str], Caller] = {}


def iam_user(stack, name: str) -> Caller:
    """An IAM user with an access key, as the emulator's STS sees it; one key per user and stack."""
    cached = _CALLERS.get((str(stack.aws_endpoint), name))
    if cached is None:
        cached = _CALLERS[(str(stack.aws_endpoint), name)] = _new_user(stack, name)
    return cached


# What IAM must allow before API Gateway calls the function at all; Relevo's grants decide next.
INVOKE_API = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "execute-api:Invoke", "Resource": "arn:aws:execute-api:*:*:*/v1/*"}
        ],
    }
)


def _new_user(stack, name: str) -> Caller:
    iam = client("iam")
    try:
        iam.create_user(UserName=name)
    except iam.exceptions.EntityAlreadyExistsException:
        pass
    iam.put_user_policy(UserName=name, PolicyName="invoke-relevo-api", PolicyDocument=INVOKE_API)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    credentials = {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
    arn = f"arn:aws:iam::{ACCOUNT}:user/{name}"
    # The identity API Gateway will put in the request context is STS's answer for this key.
    sts = boto3.client("sts", endpoint_url=stack.aws_endpoint, region_name=stack.region, **credentials)
    assert sts.get_caller_identity()["Arn"] == arn
    return Caller(arn, api_as(stack, credentials))
