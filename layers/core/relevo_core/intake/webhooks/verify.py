"""Whether a delivery comes from the project's webhook: GitHub's HMAC-SHA256 over the raw body,
GitLab's secret token. Headers only: nothing here reads the payload, so a delivery is verified
before any of its shapes (github.py, gitlab.py) is even imported."""

from __future__ import annotations

import hashlib
import hmac

from relevo_core.models.errors import ErrorCode, RelevoError

GITHUB_SIGNATURE_HEADER = "x-hub-signature-256"
GITHUB_EVENT_HEADER = "x-github-event"
GITHUB_DELIVERY_HEADER = "x-github-delivery"

GITLAB_TOKEN_HEADER = "x-gitlab-token"
GITLAB_EVENT_HEADER = "x-gitlab-event"
GITLAB_DELIVERY_HEADER = "x-gitlab-event-uuid"


def sign(secret: str, raw_body: bytes) -> str:
    """The X-Hub-Signature-256 value GitHub sends for this body."""
    return "sha256=" + hmac.new(secret.encode(), raw_body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, raw_body: bytes, header_value: str | None) -> None:
    """Refuse unless the header is the HMAC-SHA256 of the exact bytes received."""
    if not header_value or not header_value.startswith("sha256="):
        raise RelevoError(ErrorCode.SIGNATURE_INVALID, "X-Hub-Signature-256 is missing or not sha256=")
    # compare_digest: constant time, so the signature cannot be guessed byte by byte.
    if not hmac.compare_digest(sign(secret, raw_body).encode(), header_value.encode()):
        raise RelevoError(ErrorCode.SIGNATURE_INVALID, "X-Hub-Signature-256 does not match the body")


def verify_token(secret: str, header_value: str | None) -> None:
    """Refuse unless X-Gitlab-Token is exactly the project's secret token."""
    if not header_value:
        raise RelevoError(ErrorCode.SIGNATURE_INVALID, "X-Gitlab-Token is missing")
    # compare_digest: constant time, so the token cannot be guessed byte by byte.
    if not hmac.compare_digest(secret.encode(), header_value.encode()):
        raise RelevoError(ErrorCode.SIGNATURE_INVALID, "X-Gitlab-Token does not match the webhook secret")
