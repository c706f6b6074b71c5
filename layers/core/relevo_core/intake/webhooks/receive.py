"""A webhook delivery, from raw bytes to an answer: its size, its project and its sender's proof
here; what a verified delivery means and the job it makes in verified.py, imported with the first
verified delivery, so that refusing costs a container neither those imports nor any write.

AWS calls per delivery, warm (tests/integration/test_webhook_call_counts.py counts them): accepted
2 (the job's TransactWriteItems, with the delivery's record in it, and StartExecution); duplicate
1 (the cancelled transaction); ignored 1 (its record); refused 0, except one conditional PutItem
for a project's first refusal of the minute (refusals.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.utilities import parameters

from relevo_core.config import IntakeSettings
from relevo_core.intake.project_cache import CachedProject, project_cache
from relevo_core.intake.webhooks import verify
from relevo_core.intake.webhooks.incoming import IncomingDelivery
from relevo_core.intake.webhooks.refusals import note_refusal
from relevo_core.models.errors import ErrorCode, RelevoError

MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class WebhookOutcome:
    status: HTTPStatus
    body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Sender:
    source: str
    event_header: str
    delivery_header: str
    # The project's field naming the secret in Secrets Manager (Project.webhook).
    secret_field: str
    # (secret, lower-cased headers, raw body): refuses with SIGNATURE_INVALID
    verify: Callable[[str, Mapping[str, str], bytes], None]


GITHUB = _Sender(
    "github",
    verify.GITHUB_EVENT_HEADER,
    verify.GITHUB_DELIVERY_HEADER,
    "github_secret_ref",
    lambda secret, lower, raw_body: verify.verify_signature(
        secret, raw_body, lower.get(verify.GITHUB_SIGNATURE_HEADER)
    ),
)
GITLAB = _Sender(
    "gitlab",
    verify.GITLAB_EVENT_HEADER,
    verify.GITLAB_DELIVERY_HEADER,
    "gitlab_token_ref",
    lambda secret, lower, raw_body: verify.verify_token(secret, lower.get(verify.GITLAB_TOKEN_HEADER)),
)
SENDERS = {sender.source: sender for sender in (GITHUB, GITLAB)}


def _secret(settings: IntakeSettings, reference: str | None) -> str:
    if not reference:
        raise RelevoError(ErrorCode.SIGNATURE_INVALID, "this project has no webhook secret configured")
    try:
        return str(parameters.get_secret(reference, max_age=settings.secret_max_age_sec))
    except parameters.exceptions.GetParameterError as exc:
        raise RelevoError(
            ErrorCode.SECRET_UNAVAILABLE, "the project's webhook secret cannot be read"
        ) from exc


def _receive(
    settings: IntakeSettings, sender: _Sender, project_id: str, headers: Mapping[str, str], raw_body: bytes
) -> WebhookOutcome:
    lower = {name.lower(): value for name, value in headers.items()}
    delivery = IncomingDelivery.read(
        sender.source, project_id, lower, sender.event_header, sender.delivery_header, len(raw_body)
    )
    project: CachedProject | None = None
    try:
        # Size first, then the project and its signature: nothing unverified is ever parsed.
        if len(raw_body) > MAX_BODY_BYTES:
            raise RelevoError(ErrorCode.PAYLOAD_TOO_LARGE, f"body is over {MAX_BODY_BYTES} bytes")
        project = project_cache.get(settings.table_name, project_id, settings.project_cache_sec)
        sender.verify(_secret(settings, project.webhook_secret_ref(sender.secret_field)), lower, raw_body)
        # The first verified delivery imports it, and with it the models of the project, the
        # payloads and the job: refusing needs none of them.
        from relevo_core.intake.webhooks.verified import answer

        status, body = answer(settings, project.project, delivery, lower, raw_body)
    except RelevoError as exc:
        known = project is not None or project_cache.read_at(settings.table_name, project_id) is not None
        note_refusal(settings, delivery, exc, project_known=known)
        raise
    return WebhookOutcome(status, body)


def receive(
    settings: IntakeSettings, source: str, project_id: str, headers: Mapping[str, str], raw_body: bytes
) -> WebhookOutcome:
    """A delivery from `source` (a key of SENDERS: the path's /webhooks/{source}/{project_id})."""
    return _receive(settings, SENDERS[source], project_id, headers, raw_body)
