"""STS role sessions on the emulator as AWS makes and checks them, for what the per-job
credentials rely on (moto 5.2.5 does none of it):

- **Session tags.** `AssumeRole` with `Tags` makes a session whose principal tags the policies of
  the role can name as `${aws:PrincipalTag/key}` ("Passing session tags in AWS STS", "IAM policy
  elements: Variables and tags", IAM User Guide). moto ignores `Tags`: here they are kept per
  session, checked as STS checks them (at most 50, keys up to 128 and values up to 256 characters
  of `[\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]`, no key twice in any case: ValidationError), and the caller
  must be allowed `sts:TagSession` on the role by its own policies and by the role's trust policy
  (AccessDenied otherwise).
- **Policy variables.** Each request of a tagged session is authorized against the role's
  policies with its variables resolved from the session's tags; a statement naming a tag the
  session lacks does not apply (relevo_local.iam_evaluation, which the DynamoDB check shares).
- **Role chaining.** A role session that assumes a role may ask for at most one hour
  ("Role chaining", IAM User Guide; AssumeRole DurationSeconds: ValidationError past it), and
  nobody for more than the role's MaxSessionDuration.
- **Role principals.** A trust policy that names a role's ARN trusts that role's sessions ("AWS
  JSON policy elements: Principal", IAM role principals); moto compares the session's ARN with it
  literally and refuses them.
- **Expiry.** A tagged session's requests are refused once its Expiration passed (ExpiredToken /
  ExpiredTokenException, as AWS answers). The sessions the local stack makes for its own
  functions, state machine and agents carry no tags and are left unexpired: on AWS Lambda, Step
  Functions and an agent's AWS profile renew those themselves, which the local stack does not
  model. `clock` is the emulator's time for this check, for tests to move.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relevo_local.iam_evaluation import resolve_statement
from relevo_local.identity import issued_key, policy_documents

_PATCHED: set[str] = set()
MAX_SESSION_TAGS = 50
MAX_TAG_KEY = 128
MAX_TAG_VALUE = 256
CHAINED_MAX_SEC = 3600
_TAG_TEXT = re.compile(r"^[\w\s.:/=+\-@]*$", re.UNICODE)


def clock() -> dt.datetime:
    """Now, as the emulator's STS sees it (naive UTC, as moto keeps expirations)."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


@dataclass
class _Session:
    tags: dict[str, str]
    expiration: dt.datetime
    transitive: tuple[str, ...] = field(default_factory=tuple)


_SESSIONS: dict[str, _Session] = {}
_LOCK = threading.Lock()


def session_tags(access_key_id: str) -> dict[str, str] | None:
    """The principal tags of a tagged session's key (None: not a tagged session)."""
    with _LOCK:
        found = _SESSIONS.get(access_key_id)
    return dict(found.tags) if found else None


def expire_now(access_key_id: str) -> None:
    """For tests: the session of this key has expired (as if its Expiration had passed)."""
    with _LOCK:
        _SESSIONS[access_key_id].expiration = clock() - dt.timedelta(seconds=1)


def _expired(access_key_id: str) -> bool:
    with _LOCK:
        found = _SESSIONS.get(access_key_id)
    return found is not None and found.expiration <= clock()


def _tags_of(querystring: dict[str, list[str]]) -> tuple[list[tuple[str, str]], list[str]]:
    tags: dict[int, dict[str, str]] = {}
    transitive = []
    for name, values in querystring.items():
        found = re.match(r"^Tags\.member\.(\d+)\.(Key|Value)$", name)
        if found:
            tags.setdefault(int(found.group(1)), {})[found.group(2)] = values[0]
        elif name.startswith("TransitiveTagKeys.member."):
            transitive.append(values[0])
    return [(tag.get("Key", ""), tag.get("Value", "")) for _, tag in sorted(tags.items())], transitive


def _validate_tags(tags: list[tuple[str, str]]) -> None:
    from moto.sts.exceptions import STSValidationError

    if len(tags) > MAX_SESSION_TAGS:
        raise STSValidationError(
            "1 validation error detected: Value at 'tags' failed to satisfy constraint: Member must have "
            f"length less than or equal to {MAX_SESSION_TAGS}"
        )
    seen: set[str] = set()
    for key, value in tags:
        if not 1 <= len(key) <= MAX_TAG_KEY or not _TAG_TEXT.match(key):
            raise STSValidationError(
                f"1 validation error detected: Value '{key}' at 'tags.key' failed to satisfy constraint: "
                f"Member must have length less than or equal to {MAX_TAG_KEY} and match pattern "
                f"[\\p{{L}}\\p{{Z}}\\p{{N}}_.:/=+\\-@]+"
            )
        if len(value) > MAX_TAG_VALUE or not _TAG_TEXT.match(value):
            raise STSValidationError(
                f"1 validation error detected: Value '{value}' at 'tags.value' failed to satisfy "
                f"constraint: Member must have length less than or equal to {MAX_TAG_VALUE} and match "
                f"pattern [\\p{{L}}\\p{{Z}}\\p{{N}}_.:/=+\\-@]*"
            )
        if key.lower() in seen:
            raise STSValidationError(
                f"Duplicate tag keys found. Please note that Tag keys are case insensitive. (key {key})"
            )
        seen.add(key.lower())


def _denied(caller_arn: str, action: str, role_arn: str) -> Exception:
    from moto.core.exceptions import _RESTError

    error = _RESTError(
        "AccessDenied", f"User: {caller_arn} is not authorized to perform: {action} on resource: {role_arn}"
    )
    error.code = 403
    return error


def _allows(
    documents: list[dict[str, Any]], action: str, resource: str, principal: str | None = None
) -> bool:
    from moto.iam.access_control import IAMPolicy, PermissionResult

    results = {
        IAMPolicy(json.dumps(document)).is_action_permitted(action, resource, principal)
        for document in documents
    }
    return PermissionResult.DENIED not in results and PermissionResult.PERMITTED in results


def _caller(headers: Any) -> Any:
    authorization = str(headers.get("Authorization") or "")
    found = re.search(r"Credential=([^/]+)/", authorization)
    if not found:
        return None
    return issued_key(found.group(1), headers.get("X-Amz-Security-Token"))


def _check_assume_role(response: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """What STS checks of an AssumeRole beyond the caller's sts:AssumeRole (moto's own check):
    the duration against the role and role chaining, and the session tags."""
    from moto.iam.models import iam_backends
    from moto.sts.exceptions import STSValidationError

    role_arn = response._get_param("RoleArn")
    duration = response._get_int_param("DurationSeconds", 3600)
    tags, transitive = _tags_of(response.querystring)
    caller = _caller(response.headers)
    role = iam_backends[response.current_account]["aws"].get_role_by_arn(role_arn)
    if duration < 900:
        raise STSValidationError(
            f"1 validation error detected: Value '{duration}' at 'durationSeconds' failed to satisfy "
            "constraint: Member must have value greater than or equal to 900"
        )
    chained = caller is not None and ":assumed-role/" in str(caller.arn)
    if chained and duration > CHAINED_MAX_SEC:
        raise STSValidationError(
            "The requested DurationSeconds exceeds the 1 hour session limit for roles assumed by role "
            "chaining."
        )
    if duration > int(role.max_session_duration or 3600):
        raise STSValidationError(
            "The requested DurationSeconds exceeds the MaxSessionDuration set for this role."
        )
    if tags or transitive:
        _validate_tags(tags)
        if caller is not None:
            own = policy_documents(caller.collect_policies())
            trust = [
                json.loads(role.assume_role_policy_document)
                if isinstance(role.assume_role_policy_document, str)
                else role.assume_role_policy_document
            ]
            if not _allows(own, "sts:TagSession", role_arn) or not _allows(
                trust, "sts:TagSession", role_arn, str(caller.arn)
            ):
                raise _denied(str(caller.arn), "sts:TagSession", role_arn)
    return tags, transitive


def record_session_tags() -> None:
    """AssumeRole as STS does it (module docstring): checked, then the session's tags kept.
    moto 5.2.5 ignores Tags, TransitiveTagKeys and the chained-session limit."""
    if "assume_role" in _PATCHED:
        return
    from moto.sts.responses import TokenResponse

    original = TokenResponse.assume_role

    def assume_role(self: Any) -> Any:
        tags, transitive = _check_assume_role(self)
        result = original(self)
        if tags:
            session = result.result["Credentials"]  # type: ignore[index]  # the AssumedRole moto made
            with _LOCK:
                _SESSIONS[session.access_key_id] = _Session(dict(tags), session.expiration, tuple(transitive))
        return result

    TokenResponse.assume_role = assume_role
    _PATCHED.add("assume_role")


def resolve_policy_variables() -> None:
    """A tagged session's policies with their variables resolved from its tags, for every
    service's check (moto's own and relevo's DynamoDB check both collect the policies here).
    moto 5.2.5 leaves `${aws:PrincipalTag/...}` as text, so a statement naming one never matches."""
    if "variables" in _PATCHED:
        return
    from moto.iam.access_control import AssumedRoleAccessKey

    original: Callable[[Any], list[Any]] = AssumedRoleAccessKey.collect_policies

    def collect_policies(self: Any) -> list[Any]:
        policies = original(self)
        tags = session_tags(self._access_key_id)
        if tags is None:
            return policies
        context = {f"aws:PrincipalTag/{key}": value for key, value in tags.items()}
        resolved = []
        for document in policy_documents(policies):
            statements = document.get("Statement", [])
            statements = statements if isinstance(statements, list) else [statements]
            kept = [
                s
                for s in (
                    resolve_statement(statement, context)  # type: ignore[arg-type]  # str values are allowed
                    for statement in statements
                )
                if s is not None
            ]
            resolved.append(json.dumps({**document, "Statement": kept}))
        return resolved

    AssumedRoleAccessKey.collect_policies = collect_policies
    _PATCHED.add("variables")


def refuse_expired_sessions() -> None:
    """A tagged session past its Expiration is refused on every request (module docstring);
    moto 5.2.5 never expires a session."""
    if "expiry" in _PATCHED:
        return
    from moto.core.exceptions import _RESTError
    from moto.iam import access_control
    from moto.s3.exceptions import S3ClientError

    original_create = access_control.create_access_key

    def create_access_key(
        account_id: str, partition: str, access_key_id: str, headers: dict[str, str]
    ) -> Any:
        if _expired(access_key_id):
            raise access_control.CreateAccessKeyFailure(reason="ExpiredToken")
        return original_create(account_id, partition, access_key_id, headers)

    access_control.create_access_key = create_access_key

    for request_class in (access_control.IAMRequest, access_control.S3IAMRequest):
        original_raise = request_class._raise_invalid_access_key

        def _raise_invalid_access_key(self: Any, reason: str, _original: Any = original_raise) -> None:
            if reason != "ExpiredToken":
                return _original(self, reason)
            if self.__class__.__name__.startswith("S3"):
                # "Amazon S3 error responses": ExpiredToken, 400, "The provided token has expired."
                raise S3ClientError("ExpiredToken", "The provided token has expired.")
            # The JSON services say ExpiredTokenException (relevo_local.moto.iam maps it).
            error = _RESTError("ExpiredToken", "The security token included in the request is expired")
            error.code = 403
            raise error

        request_class._raise_invalid_access_key = _raise_invalid_access_key
    _PATCHED.add("expiry")


def role_principals_match_their_sessions(original: Callable[[Any, str], bool]) -> Callable[[Any, str], bool]:
    """`_check_principal` that also lets a role ARN in a trust policy match that role's sessions."""

    def _check_principal(self: Any, principal: str) -> bool:
        if original(self, principal):
            return True
        session = re.match(r"^arn:aws:sts::(\d{12}):assumed-role/([^/]+)/[^/]+$", principal)
        if not session:
            return False
        expected = (
            (self._statement.get("Principal") or {}).get("AWS")
            if isinstance(self._statement.get("Principal"), dict)
            else None
        )
        expected = [expected] if isinstance(expected, str) else expected or []
        account, role = session.groups()
        return any(
            re.match(rf"^arn:aws:iam::{account}:role/(.+/)?{re.escape(role)}$", str(value))
            for value in expected
        )

    return _check_principal
