"""Who calls AWS on the embedded emulator: the stack's own IAM user, the role sessions the services
make for their functions and state machines, and the keys the emulator issued.

AWS authorizes every request against the caller's policies, and so does the emulator once its
IAM enforcement is on (`enforce`; relevo_local.moto.iam and its neighbours make it authorize as
AWS does). So the stack itself, the CLI, the tests and the demo call AWS as an IAM user of the
emulator (`LOCAL_USER`), never with a key IAM did not issue; each function calls AWS with its
execution role's session, as Lambda gives it; the Step Functions interpreter calls each integrated
service with the state machine's role. Role sessions are made in-process, as the AWS service that
owns the role (Lambda, Step Functions) would assume it, after checking that the role's trust
policy lets that service assume it.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import requests
from botocore.credentials import Credentials

ACCOUNT_ID = "123456789012"
LOCAL_USER = "relevo-local"


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
    requests.post(
        f"{endpoint}/moto-api/reset-auth", data=b"0", headers={"Content-Type": "text/plain"}, timeout=10
    ).raise_for_status()


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


def issued_key(access_key_id: str, session_token: str | None) -> Any:
    """The emulator's record of a key it issued (an IAM user's key, or an STS session's with its
    own token), or None. moto 5.2.5 has no API that returns a secret after issuing it, so its
    IAM/STS backends (in this process) are asked, as its own IAM authentication does."""
    from moto.iam.access_control import CreateAccessKeyFailure, create_access_key

    try:
        return create_access_key(
            ACCOUNT_ID, "aws", access_key_id, {"X-Amz-Security-Token": session_token} if session_token else {}
        )
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


def policy_documents(policies: list[Any]) -> list[dict[str, Any]]:
    """The caller's policies (moto keeps them as Policy objects, JSON text or documents) as documents."""
    from moto.iam.models import Policy

    documents = []
    for policy in policies:
        if isinstance(policy, Policy):
            policy = next(version.document for version in policy.versions if version.is_default)
        if isinstance(policy, dict) and "policy_document" in policy:
            policy = policy["policy_document"]
        documents.append(json.loads(policy) if isinstance(policy, str) else policy)
    return documents
