"""Patches over moto's IAM enforcement, so that it authorizes as AWS does: the resource each request
names, account and role principals in trust policies, presigned S3 URLs, requests without a body,
and refusals in the JSON shape of the JSON-protocol services. moto 5.2.5 evaluates policies for
what it implements: actions of every service, resources for SQS, S3, IAM and STS only, no
`ForAllValues:` conditions. DynamoDB's fine-grained conditions are checked in
dynamodb_authorization, STS's sessions in sts. Each docstring names the behaviour it changes;
docs/emulator.md lists them with the test that pins each.
"""

from __future__ import annotations

import json
from typing import Any

from relevo_local.identity import issued_key
from relevo_local.moto import dynamodb_authorization, sts

_PATCHED: set[str] = set()


def sign_bodyless_requests_over_their_empty_body() -> None:
    """moto 5.2.5 recomputes a request's SigV4 signature over `self._body or self._data`: for a
    request without a body (Lambda's GET /2018-10-31/layers, Scheduler's GET and DELETE), `_data`
    is the parsed headers, so every such call fails with SignatureDoesNotMatch once enforcement
    is on. A client signs the bytes it sent, which are empty: check the signature over those."""
    if "bodyless" in _PATCHED:
        return
    from moto.iam.access_control import IAMRequestBase

    original = IAMRequestBase._create_aws_request

    def _create_aws_request(self: Any) -> Any:
        if self._body or self._method not in ("GET", "HEAD", "DELETE"):
            return original(self)
        data, self._data = self._data, b""
        try:
            return original(self)
        finally:
            self._data = data

    IAMRequestBase._create_aws_request = _create_aws_request
    _PATCHED.add("bodyless")


def _json_body(response: Any) -> dict[str, Any]:
    """The request's JSON parameters (DynamoDB's handler has already parsed them into `body`)."""
    if isinstance(response.body, dict):
        return response.body
    try:
        return json.loads(response.body or "{}")
    except (TypeError, ValueError):
        return {}


def name_the_resources_policies_scope() -> None:
    """moto 5.2.5 names the resource of a request only for SQS, S3, IAM and STS; every other
    request is checked as resource `*`, which a statement scoped to an ARN never matches, so
    every least-privilege grant of the template would be refused. Here:

    - DynamoDB (the table or index ARN), Step Functions (the state machine or execution ARN),
      SNS (the topic ARN) and Secrets Manager (the secret's ARN, from its name) requests are
      named as AWS names them in the Service Authorization Reference, so a grant on the wrong
      ARN (a Query on an index granted on the table only) is refused here as on AWS;
    - a request moto still cannot name stays `*`, and is checked on its action alone: any
      statement granting the action matches, whatever its Resource.
    Transactions and batches are named item by item in dynamodb_authorization.
    """
    if "resources" in _PATCHED:
        return
    from moto.dynamodb.responses import DynamoHandler
    from moto.iam.access_control import IAMPolicyStatement
    from moto.secretsmanager.responses import SecretsManagerResponse
    from moto.sns.responses import SNSResponse
    from moto.stepfunctions.responses import StepFunctionResponse

    def dynamodb_resource(self: Any) -> str:
        body = _json_body(self)
        return (
            dynamodb_authorization.table_arn(self.region, body["TableName"], body.get("IndexName"))
            if body.get("TableName")
            else "*"
        )

    def stepfunctions_resource(self: Any) -> str:
        body = _json_body(self)
        return str(body.get("executionArn") or body.get("stateMachineArn") or "*")

    def sns_resource(self: Any) -> str:
        return str(self._get_param("TopicArn") or "*")

    def secretsmanager_resource(self: Any) -> str:
        secret_id = _json_body(self).get("SecretId")
        if not secret_id:
            return "*"
        if str(secret_id).startswith("arn:"):
            return str(secret_id)
        from moto.secretsmanager.models import secretsmanager_backends

        try:
            return str(
                secretsmanager_backends[self.current_account][self.region].describe_secret(secret_id).arn
            )
        except (
            Exception
        ):  # no such secret: AWS checks the name's ARN pattern; the call then fails as not found
            return f"arn:aws:secretsmanager:{self.region}:{self.current_account}:secret:{secret_id}"

    DynamoHandler._determine_resource = dynamodb_resource
    StepFunctionResponse._determine_resource = stepfunctions_resource
    SNSResponse._determine_resource = sns_resource
    SecretsManagerResponse._determine_resource = secretsmanager_resource

    original = IAMPolicyStatement._check_element_matches

    def _check_element_matches(self: Any, element: Any, value: str) -> bool:
        if element == "Resource" and value == "*":
            return True
        return original(self, element, value)

    IAMPolicyStatement._check_element_matches = _check_element_matches
    _PATCHED.add("resources")


def trust_account_principals_as_iam_does() -> None:
    """moto 5.2.5 compares a trust policy's principal with the caller's ARN literally. On AWS an
    account principal (`arn:aws:iam::ACCOUNT:root`, or the bare account id) delegates to the
    account: any of its users and roles may assume the role when their own policies allow
    sts:AssumeRole ("AWS JSON policy elements: Principal", AWS account principals, IAM User
    Guide). Match it that way; a role's ARN matches that role's sessions (relevo_local.moto.sts);
    every other principal still matches literally."""
    if "account_principals" in _PATCHED:
        return
    from moto.iam.access_control import IAMPolicyStatement

    original = IAMPolicyStatement._check_principal

    def _check_principal(self: Any, principal: str) -> bool:
        expected = (
            (self._statement.get("Principal") or {}).get("AWS")
            if isinstance(self._statement.get("Principal"), dict)
            else None
        )
        expected = [expected] if isinstance(expected, str) else expected or []
        account = (
            principal.split(":")[4] if principal.startswith("arn:") and principal.count(":") >= 5 else None
        )
        if account and any(value in (account, f"arn:aws:iam::{account}:root") for value in expected):
            return True
        return original(self, principal)

    IAMPolicyStatement._check_principal = sts.role_principals_match_their_sessions(_check_principal)
    _PATCHED.add("account_principals")


def authorize_presigned_s3_urls() -> None:
    """moto 5.2.5's IAM enforcement reads SigV4 from the Authorization header only: a presigned
    URL (the signature in the query string) fails with a 500 (KeyError 'Authorization'). S3
    authenticates such a URL as the key that signed it, refuses it once X-Amz-Date plus
    X-Amz-Expires has passed ("Authenticating Requests: Using Query Parameters", Amazon S3 API
    Reference), then authorizes the request against that principal's policies. Do the same: check
    the query signature with botocore's own S3 query signer, then authorize as the signer. A
    request signed neither way is refused as AWS refuses it (moto would answer 500)."""
    if "presigned" in _PATCHED:
        return
    import datetime as dt
    from urllib.parse import parse_qsl, urlencode, urlsplit

    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.core.exceptions import _RESTError
    from moto.s3.exceptions import (
        AccessForbidden,
        S3AccessDeniedError,
        S3ClientError,
        S3InvalidAccessKeyIdError,
        S3SignatureDoesNotMatchError,
    )

    original = ActionAuthenticatorMixin._authenticate_and_authorize_action

    def _authenticate_and_authorize_action(self: Any, iam_request_cls: type, resource: str = "*") -> None:
        query = parse_qsl(urlsplit(self.uri).query, keep_blank_values=True)
        fields = dict(query)
        enforced = ActionAuthenticatorMixin.request_count >= settings.INITIAL_NO_AUTH_ACTION_COUNT
        if not enforced or "Authorization" in self.headers:
            return original(self, iam_request_cls, resource)
        if "X-Amz-Signature" not in fields:
            s3 = iam_request_cls.__name__.startswith("S3")
            if "AWSAccessKeyId" in fields and s3:  # a SigV2 query signature
                raise S3ClientError(
                    "InvalidRequest",
                    "The authorization mechanism you have provided is not supported. Please use "
                    "AWS4-HMAC-SHA256.",
                )
            # Unsigned: S3 treats it as anonymous (refused: nothing here is public), other
            # services as missing its authentication (moto would fail with a 500).
            if s3:
                raise S3AccessDeniedError()
            missing = _RESTError("MissingAuthenticationToken", "Request is missing Authentication Token")
            missing.code = 403
            raise missing
        key_id, _, region, service, _ = fields.get("X-Amz-Credential", "////").split("/", 4)
        token = fields.get("X-Amz-Security-Token")
        key = issued_key(key_id, token)
        if key is None:
            raise S3InvalidAccessKeyIdError()
        signed_at = dt.datetime.strptime(
            fields.get("X-Amz-Date", "19700101T000000Z"), "%Y%m%dT%H%M%SZ"
        ).replace(tzinfo=dt.UTC)
        expires = int(fields.get("X-Amz-Expires", "0"))
        if dt.datetime.now(dt.UTC) > signed_at + dt.timedelta(seconds=expires):
            raise AccessForbidden("Request has expired")
        unsigned = urlencode([(name, value) for name, value in query if name != "X-Amz-Signature"])
        request = AWSRequest(
            method=self.method,
            url=f"http://{self.headers.get('Host')}{self.raw_path}?{unsigned}",
            headers={"host": self.headers.get("Host")},
        )
        request.context["timestamp"] = fields["X-Amz-Date"]
        auth = S3SigV4QueryAuth(key.create_credentials(), service, region, expires=expires)
        if (
            auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
            != fields["X-Amz-Signature"]
        ):
            raise S3SignatureDoesNotMatchError()
        # Authorize as the signer: the IAM request reads who signed from an Authorization header.
        headers = dict(self.headers)
        headers["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={fields['X-Amz-Credential']}, "
            f"SignedHeaders={fields.get('X-Amz-SignedHeaders', 'host')}, "
            f"Signature={fields['X-Amz-Signature']}"
        )
        if token:
            headers["X-Amz-Security-Token"] = token
        iam_request_cls(
            account_id=self.current_account,
            method=self.method,
            path=self.raw_path,
            data=self.data,
            body=self.raw_body,
            headers=headers,
            action=self._get_action(),
        ).check_action_permitted(resource)

    ActionAuthenticatorMixin._authenticate_and_authorize_action = _authenticate_and_authorize_action
    _PATCHED.add("presigned")


# How the JSON-protocol services answer an unauthenticated or unauthorized request ("Error
# handling with DynamoDB", Amazon DynamoDB Developer Guide; the Step Functions, Secrets Manager,
# CloudWatch Logs and EventBridge API references list the same exceptions, all HTTP 400).
_JSON_REFUSALS = {
    "AccessDenied": "AccessDeniedException",
    "InvalidClientTokenId": "UnrecognizedClientException",
    "SignatureDoesNotMatch": "InvalidSignatureException",
    "ExpiredToken": "ExpiredTokenException",
}


def refuse_json_requests_as_json() -> None:
    """moto 5.2.5 answers a refused request of every service with an XML error document and HTTP
    403. botocore cannot parse XML from a JSON-protocol service (DynamoDB, Step Functions,
    Secrets Manager, SQS...), so a refused call reached the code as error code "403" and the
    state machine's interpreter named it `DynamoDB.403`, where AWS says AccessDeniedException and
    the interpreter `DynamoDB.AccessDeniedException`. Answer those services in their own JSON
    shape; SQS adds its query-compatible code in `x-amzn-query-error` ("Interpreting Amazon SQS
    JSON API responses", Amazon SQS Developer Guide), so SDKs still see `AccessDenied`."""
    if "json_refusals" in _PATCHED:
        return
    from moto.core.exceptions import JsonRESTError, _RESTError
    from moto.core.responses import BaseResponse

    original = BaseResponse._authenticate_and_authorize_normal_action

    def _authenticate_and_authorize_normal_action(self: Any, resource: str = "*") -> None:
        try:
            original(self, resource)
        except _RESTError as refused:
            target = str(self.headers.get("X-Amz-Target") or "")
            if not target or refused.error_type not in _JSON_REFUSALS:
                raise
            answer = JsonRESTError(_JSON_REFUSALS[refused.error_type], refused.message)
            answer.code = 400
            if target.startswith("AmazonSQS"):
                # moto sends this response's own headers with a refusal, not the error's.
                self.response_headers["x-amzn-query-error"] = f"{refused.error_type};Sender"
                answer.code = refused.code
            raise answer from refused

    BaseResponse._authenticate_and_authorize_normal_action = _authenticate_and_authorize_normal_action
    _PATCHED.add("json_refusals")
