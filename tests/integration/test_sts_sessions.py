"""The local stack's STS does what the per-job credentials rely on, as AWS does it, and refuses
as AWS refuses (local/relevo_local/moto/sts.py; moto 5.2.5 does none of it):
- session tags kept and named by `${aws:PrincipalTag/...}` in the role's policies;
- sts:TagSession required of the caller and of the role's trust ("Passing session tags in AWS
  STS", IAM User Guide: "the role's trust policy must allow sts:TagSession");
- at most 50 tags, no `*` in a value, no key twice in any case (ValidationError);
- at most one hour for a role's session that takes a role ("Role chaining", IAM User Guide), and
  never more than the role's MaxSessionDuration;
- a role's ARN in a trust policy trusts that role's sessions ("AWS JSON policy elements: Principal").
"""

from __future__ import annotations

import json
import secrets

import pytest

from relevo_core.aws import client
from tests.helpers.iam import client_as, refusal_code

ACCOUNT = "123456789012"


def _role(name: str, trust: dict, policy: dict | None = None, max_sec: int = 3600) -> str:
    iam = client("iam")
    arn = iam.create_role(
        RoleName=name, AssumeRolePolicyDocument=json.dumps(trust), MaxSessionDuration=max_sec
    )["Role"]["Arn"]
    if policy:
        iam.put_role_policy(RoleName=name, PolicyName="p", PolicyDocument=json.dumps(policy))
    return arn


def _trusting(principal: str, actions: list[str]) -> dict:
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": principal}, "Action": actions}],
    }


def _sts_as(stack, credentials: dict) -> object:
    """STS for this session, without botocore's own checks of the parameters: STS itself must refuse."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sts",
        endpoint_url=stack.aws_endpoint,
        region_name=stack.region,
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
        config=Config(parameter_validation=False),
    )


@pytest.fixture()
def roles(local_stack):
    """A middle role (12 h sessions, assumable by the account) whose sessions may take a tagged
    role T, which grants s3:GetObject on <bucket>/${aws:PrincipalTag/team}/*."""
    suffix = secrets.token_hex(3)
    bucket = local_stack.resources["ArtifactBucket"]
    middle = _role(
        f"middle-{suffix}",
        _trusting(f"arn:aws:iam::{ACCOUNT}:root", ["sts:AssumeRole"]),
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": ["sts:AssumeRole", "sts:TagSession"], "Resource": "*"}
            ],
        },
        max_sec=43200,
    )
    tagged = _role(
        f"tagged-{suffix}",
        _trusting(middle, ["sts:AssumeRole", "sts:TagSession"]),
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "s3:GetObject",
                    "Resource": f"arn:aws:s3:::{bucket}/${{aws:PrincipalTag/team}}/*",
                }
            ],
        },
    )
    untagging = _role(f"untagging-{suffix}", _trusting(middle, ["sts:AssumeRole"]))
    session = client("sts").assume_role(RoleArn=middle, RoleSessionName="middle", DurationSeconds=43200)[
        "Credentials"
    ]
    for team in ("a", "b"):
        client("s3").put_object(Bucket=bucket, Key=f"{team}/x", Body=team.encode())
    return {
        "middle": _sts_as(local_stack, session),
        "tagged": tagged,
        "untagging": untagging,
        "bucket": bucket,
    }


def test_a_tagged_sessions_policy_variables_reach_its_own_prefix_only(local_stack, roles):
    issued = roles["middle"].assume_role(
        RoleArn=roles["tagged"], RoleSessionName="tt", Tags=[{"Key": "team", "Value": "a"}]
    )["Credentials"]
    s3 = client_as(
        local_stack, "s3", issued["AccessKeyId"], issued["SecretAccessKey"], issued["SessionToken"]
    )
    assert s3.get_object(Bucket=roles["bucket"], Key="a/x")["Body"].read() == b"a"
    assert refusal_code(lambda: s3.get_object(Bucket=roles["bucket"], Key="b/x")) == "AccessDenied"
    untagged = roles["middle"].assume_role(RoleArn=roles["tagged"], RoleSessionName="uu")["Credentials"]
    s3 = client_as(
        local_stack, "s3", untagged["AccessKeyId"], untagged["SecretAccessKey"], untagged["SessionToken"]
    )
    # No tag, no value for the variable: the statement does not apply.
    assert refusal_code(lambda: s3.get_object(Bucket=roles["bucket"], Key="a/x")) == "AccessDenied"


def test_tags_need_sts_tag_session_in_the_roles_trust(roles):
    refused = refusal_code(
        lambda: roles["middle"].assume_role(
            RoleArn=roles["untagging"], RoleSessionName="tt", Tags=[{"Key": "team", "Value": "a"}]
        )
    )
    assert refused == "AccessDenied"
    roles["middle"].assume_role(RoleArn=roles["untagging"], RoleSessionName="tt")  # without tags it may


@pytest.mark.parametrize(
    "tags",
    [
        [{"Key": f"k{n}", "Value": "v"} for n in range(51)],
        [{"Key": "team", "Value": "a*"}],
        [{"Key": "team", "Value": "a"}, {"Key": "TEAM", "Value": "b"}],
        [{"Key": "team", "Value": "v" * 257}],
    ],
    ids=["51 tags", "a wildcard in a value", "a key twice", "a value of 257 characters"],
)
def test_tags_sts_would_refuse_are_refused(roles, tags):
    assert (
        refusal_code(
            lambda: roles["middle"].assume_role(RoleArn=roles["tagged"], RoleSessionName="tt", Tags=tags)
        )
        == "ValidationError"
    )


def test_a_role_session_taking_a_role_gets_an_hour_at_most(local_stack, roles):
    suffix = secrets.token_hex(3)
    long_role = _role(
        f"long-{suffix}", _trusting(f"arn:aws:iam::{ACCOUNT}:root", ["sts:AssumeRole"]), max_sec=43200
    )
    # An IAM user may take 12 hours of it; a role's session (role chaining) one.
    client("sts").assume_role(RoleArn=long_role, RoleSessionName="user", DurationSeconds=43200)
    assert (
        refusal_code(
            lambda: roles["middle"].assume_role(
                RoleArn=long_role, RoleSessionName="chained", DurationSeconds=3601
            )
        )
        == "ValidationError"
    )
    roles["middle"].assume_role(RoleArn=long_role, RoleSessionName="chained", DurationSeconds=3600)
    assert (
        refusal_code(
            lambda: roles["middle"].assume_role(
                RoleArn=roles["tagged"], RoleSessionName="tt", DurationSeconds=899
            )
        )
        == "ValidationError"
    )


def test_the_job_role_trusts_the_claim_functions_sessions_and_no_one_else(local_stack):
    job_role = client("iam").get_role(RoleName=local_stack.resources["JobRole"])["Role"]["Arn"]
    tags = [{"Key": "job", "Value": "job_" + "0" * 26}]
    # The stack's administrator is not the claim function.
    assert (
        refusal_code(lambda: client("sts").assume_role(RoleArn=job_role, RoleSessionName="admin", Tags=tags))
        == "AccessDenied"
    )
    agent = local_stack.agent_credentials["eu-west"]
    sts = client_as(local_stack, "sts", agent.access_key_id, agent.secret_access_key, agent.session_token)
    assert (
        refusal_code(lambda: sts.assume_role(RoleArn=job_role, RoleSessionName="agent", Tags=tags))
        == "AccessDenied"
    )


def test_the_longest_session_name_of_a_shards_job_credentials_is_taken_and_one_longer_is_refused(
    local_stack, roles
):
    """RoleSessionName: 2 to 64 characters (AssumeRole, STS API Reference). The longest a shard's
    job credentials may carry (relevo_core.fleet.job_credentials.session_name) is taken, and so is
    one of 64; one of 65 is refused, as AWS refuses it."""
    from relevo_core.fleet.job_credentials import session_name
    from relevo_core.models.plan import MAX_DECLARED_SHARDS

    longest = session_name("job_" + "z" * 40, 99, 1000, shard=MAX_DECLARED_SHARDS - 1)
    suffix = secrets.token_hex(3)
    role = _role(f"names-{suffix}", _trusting(f"arn:aws:iam::{ACCOUNT}:root", ["sts:AssumeRole"]))
    # A role's session takes it, as the claim function's does (botocore's own checks are off).
    taken = roles["middle"].assume_role(RoleArn=role, RoleSessionName=longest)["AssumedRoleUser"]["Arn"]
    assert taken.endswith(f"/{longest}") and len(longest) == 62
    roles["middle"].assume_role(RoleArn=role, RoleSessionName=longest + "99")  # 64: the bound itself
    assert (
        refusal_code(lambda: roles["middle"].assume_role(RoleArn=role, RoleSessionName=longest + "999"))
        == "ValidationError"
    )
