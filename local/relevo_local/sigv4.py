"""What API Gateway does for an IAM route before it calls the function: check the request's SigV4
signature against the secret of the access key that claims to have signed it. Only then is the
key's identity (STS GetCallerIdentity for that key) put in the request context.

The emulator knows the secret of every key it issued (IAM CreateAccessKey, STS AssumeRole), so
locally a request signed with someone else's access key id, a wrong secret, or a key the
emulator never issued is refused exactly as AWS refuses it."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

_AUTHORIZATION = re.compile(
    r"^AWS4-HMAC-SHA256 "
    r"Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request,\s*"
    r"SignedHeaders=(?P<signed>[^,]+),\s*Signature=(?P<signature>[0-9a-f]{64})$"
)
# API Gateway refuses a signature older (or newer) than this.
MAX_SKEW = dt.timedelta(minutes=15)


@dataclass(frozen=True)
class Refusal:
    """API Gateway's own answer (403) to a request it could not authenticate, and the gateway
    response type that shapes it."""

    message: str
    response_type: str = "MISSING_AUTHENTICATION_TOKEN"


MISSING = Refusal("Missing Authentication Token")
INVALID_KEY = Refusal("The security token included in the request is invalid.", "INVALID_SIGNATURE")
BAD_SIGNATURE = Refusal(
    "The request signature we calculated does not match the signature you provided. Check your AWS "
    "Secret Access Key and signing method. Consult the service documentation for details.",
    "INVALID_SIGNATURE",
)
EXPIRED = Refusal(
    "Signature expired: the request's X-Amz-Date is too far from the server's time.", "EXPIRED_TOKEN"
)


def verify(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    credentials_for: Callable[[str, str | None], Credentials | None],
    now: dt.datetime,
) -> str | Refusal:
    """The access key id that signed this request, or why it is refused. `credentials_for(key,
    session_token)` returns the key's credentials when the emulator issued it (and the session
    token, if any, is the key's own)."""
    lower = {name.lower(): value for name, value in headers.items()}
    found = _AUTHORIZATION.match(lower.get("authorization", "").strip())
    if not found:
        return MISSING
    credentials = credentials_for(found["key"], lower.get("x-amz-security-token"))
    if credentials is None:
        return INVALID_KEY
    try:
        signed_at = dt.datetime.strptime(lower.get("x-amz-date", ""), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return MISSING
    if abs(now - signed_at) > MAX_SKEW:
        return EXPIRED
    signed = found["signed"].split(";")
    if "host" not in signed:
        return BAD_SIGNATURE
    request = AWSRequest(
        method=method,
        url=url,
        data=body,
        headers={name: value for name, value in lower.items() if name in signed},
    )
    request.context["timestamp"] = lower["x-amz-date"]
    auth = SigV4Auth(credentials, found["service"], found["region"])
    canonical = auth.canonical_request(request)
    expected = auth.signature(auth.string_to_sign(request, canonical), request)
    if expected != found["signature"]:
        return BAD_SIGNATURE
    return found["key"]
