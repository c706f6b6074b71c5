"""The local stack runs under the IAM rules AWS enforces, where the emulator can enforce them.

Functions call AWS with their own execution role's session, the state machine's integrations run
as its role, API Gateway checks execute-api:Invoke, and a key IAM never issued is refused. What
moto 5.2.5 cannot check (DynamoDB key conditions, KMS key policies) is covered by the template's
policy lint instead (tests/infrastructure)."""

from __future__ import annotations

import datetime as dt
import json
import secrets
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import boto3
import pytest
import requests
from botocore.exceptions import ClientError

from relevo_cli.api import RelevoApi, SigV4RequestAuth
from relevo_core.aws import client, s3_presigner
from relevo_local.identity import ACCOUNT_ID, RoleNotAssumable, local_user_arn
from relevo_local.moto.dynamodb_authorization import checks
from tests.helpers.iam import client_as, refusal_code
from tests.helpers.stack import wait_until

TABLE_INDEX = "ProjectJobsIndex"


def _client(stack, service: str, credentials: Any) -> Any:
    return client_as(stack, service, credentials.access_key, credentials.secret_key, credentials.token)


def _role_of(emulator, function: str) -> Any:
    return emulator._runtimes[function].spec.credentials()


def test_each_function_runs_as_its_own_execution_role(emulator):
    # Given the session Lambda gives the webhook function
    credentials = _role_of(emulator, "WebhookFunction")
    identity = _client(emulator.info, "sts", credentials).get_caller_identity()
    role = client("lambda").get_function_configuration(
        FunctionName=emulator.info.resources["WebhookFunction"]
    )["Role"]
    # Then it is that role's session, named after the function, as on AWS
    assert (
        identity["Arn"]
        == role.replace(":iam::", ":sts::").replace(":role/", ":assumed-role/")
        + "/"
        + emulator._runtimes["WebhookFunction"].name
    )


def test_a_role_refuses_what_its_policy_does_not_grant(emulator):
    stack = emulator.info
    webhook = _role_of(emulator, "WebhookFunction")
    dynamodb, sqs, sfn = (
        _client(stack, service, webhook) for service in ("dynamodb", "sqs", "stepfunctions")
    )
    key = {"pk": {"S": "JOB#none"}, "sk": {"S": "JOB"}}
    # Granted: reading an item, resolving a work queue's URL.
    dynamodb.get_item(TableName=stack.table_name, Key=key)
    queue_url = sqs.get_queue_url(QueueName=stack.work_queues["eu-west"].rsplit("/", 1)[1])["QueueUrl"]
    # Not granted: deleting items, sending to a work queue (only the state machine dispatches),
    # stopping executions. DynamoDB and Step Functions answer in their own JSON shape.
    assert (
        refusal_code(lambda: dynamodb.delete_item(TableName=stack.table_name, Key=key))
        == "AccessDeniedException"
    )
    assert refusal_code(lambda: sqs.send_message(QueueUrl=queue_url, MessageBody="{}")) == "AccessDenied"
    for machine in stack.machines:
        machine_name = machine.rsplit(":", 1)[1]
        execution = f"arn:aws:states:{stack.region}:{ACCOUNT_ID}:execution:{machine_name}:none"
        assert refusal_code(lambda execution=execution: sfn.stop_execution(executionArn=execution)) == (
            "AccessDeniedException"
        )


def test_dynamodb_requests_are_checked_against_the_table_or_index_they_name(emulator):
    stack = emulator.info
    # The jobs function may query the ProjectJobsIndex and the table, not the StartPendingIndex.
    jobs = _client(stack, "dynamodb", _role_of(emulator, "JobsFunction"))
    query = {
        "KeyConditionExpression": "project_jobs = :p",
        "ExpressionAttributeValues": {":p": {"S": "none"}},
    }
    jobs.query(TableName=stack.table_name, IndexName=TABLE_INDEX, **query)
    refused = refusal_code(
        lambda: jobs.query(
            TableName=stack.table_name,
            IndexName="StartPendingIndex",
            KeyConditionExpression="start_pending = :p",
            ExpressionAttributeValues={":p": {"S": "1"}},
        )
    )
    assert refused == "AccessDeniedException"


def test_a_key_iam_never_issued_is_refused(emulator):
    stack = emulator.info
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=stack.aws_endpoint,
        region_name=stack.region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    assert (
        refusal_code(lambda: dynamodb.describe_table(TableName=stack.table_name))
        == "UnrecognizedClientException"
    )


def _scratch_role(policy_actions: list[str], table_arn: str) -> str:
    """A role Step Functions may assume, allowed only `policy_actions` on the table."""
    iam = client("iam")
    name = f"relevo-test-sfn-{secrets.token_hex(3)}"
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "states.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    }
    arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    iam.put_role_policy(
        RoleName=name,
        PolicyName="table",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": policy_actions, "Resource": table_arn}],
            }
        ),
    )
    return arn


@pytest.mark.parametrize(
    "granted, expected", [(["dynamodb:PutItem"], "SUCCEEDED"), (["dynamodb:GetItem"], "FAILED")]
)
def test_the_state_machine_calls_its_integrations_as_its_execution_role(local_stack, granted, expected):
    table_arn = f"arn:aws:dynamodb:{local_stack.region}:{ACCOUNT_ID}:table/{local_stack.table_name}"
    definition = {
        "StartAt": "Put",
        "States": {
            "Put": {
                "Type": "Task",
                "Resource": "arn:aws:states:::dynamodb:putItem",
                "Parameters": {
                    "TableName": local_stack.table_name,
                    "Item": {"pk": {"S": "IAMTEST#x"}, "sk": {"S": "x"}},
                },
                "End": True,
            }
        },
    }
    sfn = client("stepfunctions")
    machine = sfn.create_state_machine(
        name=f"iam-{secrets.token_hex(3)}",
        definition=json.dumps(definition),
        roleArn=_scratch_role(granted, table_arn),
    )["stateMachineArn"]
    execution = sfn.start_execution(stateMachineArn=machine)["executionArn"]
    described = wait_until(
        lambda: (d := sfn.describe_execution(executionArn=execution))["status"] != "RUNNING" and d,
        20,
        "the execution's end",
    )
    assert described["status"] == expected, described
    if expected == "FAILED":
        # AWS's name for it (the interpreter saw DynamoDB's own JSON refusal).
        assert described.get("error") == "DynamoDB.AccessDeniedException", described


def test_a_transaction_is_authorized_item_by_item_as_aws_does(emulator):
    stack = emulator.info
    table_arn = f"arn:aws:dynamodb:{stack.region}:{ACCOUNT_ID}:table/{stack.table_name}"
    # A role that may UpdateItem, and may "TransactWriteItems" (no such IAM action), not PutItem.
    role = _scratch_role(["dynamodb:UpdateItem", "dynamodb:TransactWriteItems"], table_arn)
    credentials = emulator.role_sessions.credentials(role, "states.amazonaws.com", "relevo-test")
    dynamodb = _client(stack, "dynamodb", credentials)
    # Not a job's key: the session's other tests read every JOB# item of the table.
    job = {"pk": {"S": f"IAMTEST#{secrets.token_hex(3)}"}, "sk": {"S": "JOB"}}
    update = {
        "Update": {
            "TableName": stack.table_name,
            "Key": job,
            "UpdateExpression": "SET probe = :v",
            "ExpressionAttributeValues": {":v": {"S": "1"}},
        }
    }
    put = {"Put": {"TableName": stack.table_name, "Item": {**job, "sk": {"S": "OTHER"}}}}
    dynamodb.transact_write_items(TransactItems=[update])
    assert (
        refusal_code(lambda: dynamodb.transact_write_items(TransactItems=[update, put]))
        == "AccessDeniedException"
    )
    assert [
        (action, resource)
        for action, resource, _ in checks(
            "dynamodb:TransactWriteItems", {"TransactItems": [update, put]}, stack.region
        )
    ] == [
        ("dynamodb:UpdateItem", table_arn),
        ("dynamodb:PutItem", table_arn),
    ]


def test_a_role_is_assumed_only_by_the_service_its_trust_policy_names(emulator):
    role = client("lambda").get_function_configuration(FunctionName=emulator.info.resources["JobsFunction"])[
        "Role"
    ]
    with pytest.raises(RoleNotAssumable):
        emulator.role_sessions.credentials(role, "states.amazonaws.com", "not-lambda")


def test_api_gateway_checks_execute_api_invoke_before_the_function_runs(local_stack):
    iam = client("iam")
    name = f"relevo-test-noinvoke-{secrets.token_hex(3)}"
    iam.create_user(UserName=name)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    session = boto3.session.Session(
        region_name=local_stack.region,
        aws_access_key_id=key["AccessKeyId"],
        aws_secret_access_key=key["SecretAccessKey"],
    )
    # A user with no policy at all: API Gateway refuses it, the function never runs.
    response = requests.get(
        local_stack.api_url.rstrip("/") + "/projects",
        auth=SigV4RequestAuth(session, local_stack.region),
        timeout=30,
    )
    assert response.status_code == 403
    assert "is not authorized to perform: execute-api:Invoke" in response.text
    # The stack's own user may (its policy allows everything).
    assert RelevoApi.for_stack(local_stack).request("GET", "/projects") is not None
    assert local_user_arn().endswith(":user/relevo-local")


def _presigned(stack, key: str, expires: int, signed_at: dt.datetime | None = None) -> str:
    client("s3").put_object(Bucket=stack.resources["ArtifactBucket"], Key=key, Body=b"artifact")
    s3 = s3_presigner()
    if signed_at is None:
        return s3.generate_presigned_url(
            "get_object", Params={"Bucket": stack.resources["ArtifactBucket"], "Key": key}, ExpiresIn=expires
        )
    import botocore.auth

    class Then(dt.datetime):
        @classmethod
        def utcnow(cls):  # type: ignore[override]  # the clock at signing time
            return signed_at.replace(tzinfo=None)

    real = botocore.auth.datetime.datetime
    botocore.auth.datetime.datetime = Then
    try:
        return s3.generate_presigned_url(
            "get_object", Params={"Bucket": stack.resources["ArtifactBucket"], "Key": key}, ExpiresIn=expires
        )
    finally:
        botocore.auth.datetime.datetime = real


def test_a_presigned_link_works_as_its_signer_until_it_expires(local_stack):
    key = f"iam-test/{secrets.token_hex(3)}.txt"
    assert requests.get(_presigned(local_stack, key, 120), timeout=30).content == b"artifact"
    # Unsigned: refused, as for any private bucket.
    bucket = local_stack.resources["ArtifactBucket"]
    assert requests.get(f"{local_stack.aws_endpoint}/{bucket}/{key}", timeout=30).status_code == 403
    # Signed ten minutes ago for two: expired, as S3 refuses it.
    old = _presigned(local_stack, key, 120, dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10))
    expired = requests.get(old, timeout=30)
    assert expired.status_code == 403 and "Request has expired" in expired.text
    # A link altered after signing (another object) is refused.
    parts = urlsplit(_presigned(local_stack, key, 120))
    tampered = urlunsplit(parts._replace(path=parts.path.replace(".txt", ".zip")))
    refused = requests.get(tampered, timeout=30)
    assert refused.status_code == 403 and "SignatureDoesNotMatch" in refused.text


def test_functions_trace_with_the_x_ray_sdk_the_layer_ships(emulator):
    emulator.trace_daemon.segments()  # what earlier tests left
    RelevoApi.for_stack(emulator.info).request("GET", "/projects")
    segments = emulator.trace_daemon.segments()
    # Powertools' Tracer ran (no tracing turned off by the stack) and recorded the DynamoDB calls.
    assert any(
        segment.get("name") == "DynamoDB" or segment.get("namespace") == "aws" for segment in segments
    ), segments[:3]


def test_the_webhook_function_reads_webhook_secrets_and_no_signing_identity(emulator):
    """Signing identities (relevo/<stack>/_signing/…, issue 20) are the agents' alone: the webhook
    function's grant of relevo/<stack>/* leaves them out by an explicit Deny, which wins over any
    Allow (IAM User Guide, "Policy evaluation logic")."""
    stack = emulator.info
    name = f"relevo/{stack.stack_name}/_signing/eu-west/iam-{secrets.token_hex(3)}/dist.p12"
    client("secretsmanager").create_secret(Name=name, SecretBinary=b"p12")
    hook = client("secretsmanager").create_secret(
        Name=f"relevo/{stack.stack_name}/iam-{secrets.token_hex(3)}/github", SecretString="s"
    )["Name"]
    webhook = _client(stack, "secretsmanager", _role_of(emulator, "WebhookFunction"))
    assert webhook.get_secret_value(SecretId=hook)["SecretString"] == "s"
    assert refusal_code(lambda: webhook.get_secret_value(SecretId=name)) == "AccessDeniedException"


def test_a_missing_key_is_told_apart_only_to_a_caller_that_may_list_the_bucket(local_stack):
    """Amazon S3 API Reference, GetObject and HeadObject, "Permissions": without s3:ListBucket a
    missing object answers 403 Access Denied, with it 404 (the key asked as s3:prefix)."""
    from relevo_local.identity import create_user

    bucket = local_stack.resources["ArtifactBucket"]
    prefix = f"iam-list-{secrets.token_hex(3)}/"
    client("s3").put_object(Bucket=bucket, Key=f"{prefix}there", Body=b"x")
    get_only = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"}
    list_prefix = {
        "Effect": "Allow",
        "Action": "s3:ListBucket",
        "Resource": f"arn:aws:s3:::{bucket}",
        "Condition": {"StringLike": {"s3:prefix": f"{prefix}*"}},
    }

    def s3_of(*statements: dict[str, Any]) -> Any:
        name = f"relevo-test-s3-{secrets.token_hex(3)}"
        credentials = create_user(
            client("iam"), name, {"Version": "2012-10-17", "Statement": list(statements)}
        )
        return client_as(local_stack, "s3", credentials.access_key, credentials.secret_key, None)

    def refused(call) -> tuple[int, str]:
        with pytest.raises(ClientError) as error:
            call()
        return error.value.response["ResponseMetadata"]["HTTPStatusCode"], error.value.response["Error"][
            "Code"
        ]

    # Given a caller that may only GetObject
    reader = s3_of(get_only)
    # Then what exists is read, and a missing key is refused as S3 refuses it: 403 AccessDenied
    # (a HEAD has no body: botocore says "403")
    assert reader.get_object(Bucket=bucket, Key=f"{prefix}there")["Body"].read() == b"x"
    assert refused(lambda: reader.get_object(Bucket=bucket, Key=f"{prefix}missing")) == (403, "AccessDenied")
    assert refused(lambda: reader.head_object(Bucket=bucket, Key=f"{prefix}missing")) == (403, "403")

    # Given a caller that may also list the bucket under that prefix
    lister = s3_of(get_only, list_prefix)
    # Then a missing key under the prefix is told apart (404), one outside it is not
    assert refused(lambda: lister.get_object(Bucket=bucket, Key=f"{prefix}missing")) == (404, "NoSuchKey")
    assert refused(lambda: lister.head_object(Bucket=bucket, Key=f"{prefix}missing")) == (404, "404")
    assert refused(lambda: lister.get_object(Bucket=bucket, Key="elsewhere/missing")) == (403, "AccessDenied")
