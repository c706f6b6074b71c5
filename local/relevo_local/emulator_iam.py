"""IAM on the embedded emulator: enforcement on, each caller with its own credentials.

AWS authorizes every request against the caller's policies. moto does too once its IAM
enforcement is on (`POST /moto-api/reset-auth` with `0`), for what it implements: actions for
every service, resources for SQS, S3, IAM and STS (DynamoDB and Step Functions are checked as
`*`), no `ForAllValues:` conditions (checked on moto 5.2.5). The local stack turns it on, so:

- the stack itself, the CLI, the tests and the demo call AWS as an IAM user of the emulator
  (`LOCAL_USER`), never with a key IAM did not issue (enforcement refuses those);
- each function calls AWS with its execution role's session credentials, as Lambda gives it;
- the Step Functions interpreter calls each integrated service with the state machine's role.

Two gaps of moto 5.2.5 are closed here (see each patch): its interpreter's fixed `ak`/`sk` key,
and `TransactWriteItems` checked as an action of its own. Role sessions are made in-process, as
the AWS service that owns the role (Lambda, Step Functions) would assume it, after checking that
the role's trust policy lets that service assume it.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, Callable

import requests
from botocore.credentials import Credentials

from relevo_local import dynamodb_authorization, sts_sessions

ACCOUNT_ID = "123456789012"
LOCAL_USER = "relevo-local"
_PATCHED: set[str] = set()


class RoleNotAssumable(RuntimeError):
    """The role's trust policy does not let the service assume it (Lambda and Step Functions
    refuse such a role when the function or state machine is created)."""


def create_user(iam: Any, name: str, policy: dict[str, Any]) -> Credentials:
    """An IAM user of the emulator with one inline policy and an access key."""
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return Credentials(key["AccessKeyId"], key["SecretAccessKey"])


def local_user(iam: Any) -> Credentials:
    """The stack's own IAM user: may do everything in the emulator's account, like the account
    administrator who deploys the stack."""
    return create_user(
        iam,
        LOCAL_USER,
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]},
    )


def local_user_arn() -> str:
    return f"arn:aws:iam::{ACCOUNT_ID}:user/{LOCAL_USER}"


def enforce(endpoint: str) -> None:
    """From now on the emulator authenticates and authorizes every request."""
    requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0", headers={"Content-Type": "text/plain"}, timeout=10).raise_for_status()


def _trusts(document: Any, service: str) -> bool:
    policy = json.loads(document) if isinstance(document, str) else document
    statements = policy.get("Statement", [])
    for statement in statements if isinstance(statements, list) else [statements]:
        actions = statement.get("Action", [])
        actions = actions if isinstance(actions, list) else [actions]
        services = (statement.get("Principal") or {}).get("Service", [])
        services = services if isinstance(services, list) else [services]
        if statement.get("Effect") == "Allow" and "sts:AssumeRole" in actions and service in services:
            return True
    return False


class RoleSessions:
    """Session credentials of the stack's roles, made as the trusted service would make them;
    one session per role and session name, reused (moto 5.2.5 does not expire sessions)."""

    def __init__(self, region: str) -> None:
        self.region = region
        self._sessions: dict[tuple[str, str], Credentials] = {}
        self._lock = threading.Lock()

    def credentials(self, role_arn: str, service: str, session_name: str) -> Credentials:
        with self._lock:
            cached = self._sessions.get((role_arn, session_name))
            if cached is not None:
                return cached
            from moto.iam.models import iam_backends
            from moto.sts.models import sts_backends

            role = iam_backends[ACCOUNT_ID]["aws"].get_role_by_arn(role_arn)
            if not _trusts(role.assume_role_policy_document, service):
                raise RoleNotAssumable(f"the trust policy of {role_arn} does not let {service} assume it")
            session = sts_backends[ACCOUNT_ID]["aws"].assume_role(
                region_name=self.region,
                role_session_name=session_name,
                role_arn=role_arn,
                policy="",
                duration=43200,
                external_id="",
            )
            credentials = Credentials(session.access_key_id, session.secret_access_key, session.session_token)
            self._sessions[(role_arn, session_name)] = credentials
            return credentials


def run_interpreter_as_execution_role(sessions: RoleSessions) -> None:
    """moto 5.2.5's Step Functions interpreter calls every integrated service with the fixed key
    `ak`/`sk` (moto/stepfunctions/parser/asl/utils/boto_client.py), which enforcement refuses. On
    AWS a state machine calls them as its execution role, whose policy then decides: the client
    is built with that role's session instead (same endpoint, same timeouts, no retries)."""
    if "interpreter" in _PATCHED:
        return
    from botocore.config import Config
    import boto3
    from moto.settings import moto_server_port
    from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import TimeoutSeconds
    from moto.stepfunctions.parser.asl.utils import boto_client

    original = boto_client.boto_client_for
    # moto builds a new client for every task state it runs. Building one copies botocore's
    # event emitter and loads the service model: tens of milliseconds holding the GIL, for each
    # state of each execution. A client is safe to share between threads, so one per service and
    # role session is built and kept (a renewed session gets its own).
    clients: dict[tuple[str, str, str], Any] = {}
    clients_lock = threading.Lock()

    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        if state_credentials is None:
            raise RuntimeError(f"the Step Functions interpreter called {service} without the execution's role")
        credentials = sessions.credentials(state_credentials.role_arn, "states.amazonaws.com", "relevo-execution")
        cache_key = (region, service, credentials.access_key)
        with clients_lock:
            if cache_key not in clients:
                clients[cache_key] = _interpreter_client(region, service, credentials)
            return clients[cache_key]

    def _interpreter_client(region: str, service: str, credentials: Credentials) -> Any:
        return boto3.client(
            service_name=service,
            region_name=region,
            endpoint_url=f"http://localhost:{moto_server_port()}",
            aws_access_key_id=credentials.access_key,
            aws_secret_access_key=credentials.secret_key,
            aws_session_token=credentials.token,
            config=Config(
                parameter_validation=False,
                retries={"max_attempts": 0, "total_max_attempts": 1},
                # Shared by every execution running at once (each holds a connection per call).
                max_pool_connections=64,
                connect_timeout=TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS,
                read_timeout=TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS,
            ),
        )

    boto_client.boto_client_for = boto_client_for
    # The service modules imported the function by name: rebind it where they hold it.
    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "boto_client_for", None) is original:
            module.boto_client_for = boto_client_for
    _PATCHED.add("interpreter")


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


def read_inline_policies_created_by_cloudformation() -> None:
    """moto 5.2.5's CloudFormation stores a role's inline `Policies` as parsed documents, and its
    IAM authorization then fails (500, KeyError 'policy_document') on the first request a
    stack-created role makes, since it expects each document as JSON text. Read those documents
    as the JSON they are."""
    if "inline_policies" in _PATCHED:
        return
    from moto.iam import access_control

    original = access_control.IAMPolicy.__init__

    def __init__(self: Any, policy: Any) -> None:
        if isinstance(policy, dict) and "policy_document" not in policy:
            policy = json.dumps(policy)
        original(self, policy)

    access_control.IAMPolicy.__init__ = __init__
    _PATCHED.add("inline_policies")


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
        return dynamodb_authorization.table_arn(self.region, body["TableName"], body.get("IndexName")) if body.get("TableName") else "*"

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
            return str(secretsmanager_backends[self.current_account][self.region].describe_secret(secret_id).arn)
        except Exception:  # no such secret: AWS checks the name's ARN pattern; the call then fails as not found
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
    Guide). Match it that way; a role's ARN matches that role's sessions (relevo_local.sts_sessions);
    every other principal still matches literally."""
    if "account_principals" in _PATCHED:
        return
    from moto.iam.access_control import IAMPolicyStatement

    original = IAMPolicyStatement._check_principal

    def _check_principal(self: Any, principal: str) -> bool:
        expected = (self._statement.get("Principal") or {}).get("AWS") if isinstance(self._statement.get("Principal"), dict) else None
        expected = [expected] if isinstance(expected, str) else expected or []
        account = principal.split(":")[4] if principal.startswith("arn:") and principal.count(":") >= 5 else None
        if account and any(value in (account, f"arn:aws:iam::{account}:root") for value in expected):
            return True
        return original(self, principal)

    IAMPolicyStatement._check_principal = sts_sessions.role_principals_match_their_sessions(_check_principal)
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
                raise S3ClientError("InvalidRequest", "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256.")
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
        signed_at = dt.datetime.strptime(fields.get("X-Amz-Date", "19700101T000000Z"), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
        expires = int(fields.get("X-Amz-Expires", "0"))
        if dt.datetime.now(dt.timezone.utc) > signed_at + dt.timedelta(seconds=expires):
            raise AccessForbidden("Request has expired")
        unsigned = urlencode([(name, value) for name, value in query if name != "X-Amz-Signature"])
        request = AWSRequest(
            method=self.method,
            url=f"http://{self.headers.get('Host')}{self.raw_path}?{unsigned}",
            headers={"host": self.headers.get("Host")},
        )
        request.context["timestamp"] = fields["X-Amz-Date"]
        auth = S3SigV4QueryAuth(key.create_credentials(), service, region, expires=expires)
        if auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request) != fields["X-Amz-Signature"]:
            raise S3SignatureDoesNotMatchError()
        # Authorize as the signer: the IAM request reads who signed from an Authorization header.
        headers = dict(self.headers)
        headers["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={fields['X-Amz-Credential']}, "
            f"SignedHeaders={fields.get('X-Amz-SignedHeaders', 'host')}, Signature={fields['X-Amz-Signature']}"
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


def install(sessions: RoleSessions) -> None:
    """Every patch above, for the emulator running in this process (each is installed once)."""
    read_inline_policies_created_by_cloudformation()
    name_the_resources_policies_scope()
    dynamodb_authorization.authorize_dynamodb_as_aws_does()
    sign_bodyless_requests_over_their_empty_body()
    authorize_presigned_s3_urls()
    trust_account_principals_as_iam_does()
    refuse_json_requests_as_json()
    sts_sessions.install()
    run_interpreter_as_execution_role(sessions)


def issued_key(access_key_id: str, session_token: str | None) -> Any:
    """The emulator's record of a key it issued (an IAM user's key, or an STS session's with its
    own token), or None. moto 5.2.5 has no API that returns a secret after issuing it, so its
    IAM/STS backends (in this process) are asked, as its own IAM authentication does."""
    from moto.iam.access_control import CreateAccessKeyFailure, create_access_key

    try:
        return create_access_key(ACCOUNT_ID, "aws", access_key_id, {"X-Amz-Security-Token": session_token} if session_token else {})
    except CreateAccessKeyFailure:
        return None


def permits(access_key_id: str, session_token: str | None, action: str, resource: str) -> bool:
    """Whether the principal of this emulator-issued key may do `action` on `resource` under its
    identity policies (IAM's rule: an explicit deny wins, else some statement must allow). For
    what another service authorizes on its own side, such as API Gateway's execute-api:Invoke."""
    from moto.iam.access_control import IAMPolicy, PermissionResult

    key = issued_key(access_key_id, session_token)
    if key is None:
        return False
    results = {IAMPolicy(policy).is_action_permitted(action, resource) for policy in key.collect_policies()}
    return PermissionResult.DENIED not in results and PermissionResult.PERMITTED in results
