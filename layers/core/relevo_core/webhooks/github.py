"""GitHub webhooks: signature check over the raw body, and the payload shapes Relevo reads."""

from __future__ import annotations

import hashlib
import hmac

from pydantic import BaseModel, ConfigDict, Field

from relevo_core.models.errors import ErrorCode, RelevoError

SIGNATURE_HEADER = "x-hub-signature-256"
EVENT_HEADER = "x-github-event"
DELIVERY_HEADER = "x-github-delivery"
ZERO_SHA = "0" * 40


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


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Repository(_Payload):
    full_name: str


class PushEvent(_Payload):
    ref: str
    before: str = ZERO_SHA
    after: str
    deleted: bool = False
    repository: Repository
    pusher: dict[str, object] = Field(default_factory=dict)

    @property
    def is_deletion(self) -> bool:
        return self.deleted or self.after == ZERO_SHA
