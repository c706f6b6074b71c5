"""A webhook delivery, from raw bytes to a job: verify, read, decide, enqueue."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Callable, Mapping

from aws_lambda_powertools.utilities import parameters
from pydantic import ValidationError

from relevo_core.config import IntakeSettings
from relevo_core.intake.enqueue import enqueue, project_cache
from relevo_core.models.envelope import Trigger, TriggerType, validation_error
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.project import ForkPolicy, Project
from relevo_core.models.status import HeldReason
from relevo_core.intake.webhooks import github, gitlab
from relevo_core.intake.webhooks.events import GitTrigger, Ignored, Pong
from relevo_core.intake.webhooks.records import record_incoming

MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class WebhookOutcome:
    status: HTTPStatus
    body: dict[str, Any] = field(default_factory=dict)


def _secret(settings: IntakeSettings, reference: str | None) -> str:
    if not reference:
        raise RelevoError(ErrorCode.SIGNATURE_INVALID, "this project has no webhook secret configured")
    try:
        return str(parameters.get_secret(reference, max_age=settings.secret_max_age_sec))
    except parameters.exceptions.GetParameterError as exc:
        raise RelevoError(ErrorCode.SECRET_UNAVAILABLE, "the project's webhook secret cannot be read") from exc


# GitHub's "Creating webhooks" docs: with content type application/x-www-form-urlencoded the JSON
# payload is sent as a form parameter called `payload`; application/json sends it as the body.
FORM_ENCODED_HINT = (
    "body is not JSON: it is form-encoded (payload=…); set the webhook's content type to application/json "
    "(GitHub: Settings → Webhooks → Content type)"
)


def _json(raw_body: bytes, content_type: str) -> Any:
    try:
        payload = json.loads(raw_body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        if raw_body.startswith(b"payload=") or content_type.startswith("application/x-www-form-urlencoded"):
            raise RelevoError(ErrorCode.MALFORMED_JSON, FORM_ENCODED_HINT) from exc
        raise RelevoError(ErrorCode.MALFORMED_JSON, f"body is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise RelevoError(ErrorCode.VALIDATION_FAILED, "(root): a webhook payload is a JSON object")
    return payload


def _receive(
    settings: IntakeSettings,
    project_id: str,
    headers: Mapping[str, str],
    raw_body: bytes,
    verify: Callable[[Project, dict[str, str]], None],
    parse: Callable[[dict[str, str], dict[str, Any]], GitTrigger | Ignored | Pong],
) -> WebhookOutcome:
    # Size first, then the project and its signature: nothing unverified is ever parsed.
    if len(raw_body) > MAX_BODY_BYTES:
        raise RelevoError(ErrorCode.PAYLOAD_TOO_LARGE, f"body is over {MAX_BODY_BYTES} bytes")
    lower = {name.lower(): value for name, value in headers.items()}
    project = project_cache.get(settings.table_name, project_id, settings.project_cache_sec)
    verify(project, lower)
    try:
        event = parse(lower, _json(raw_body, lower.get("content-type", "").lower()))
    except ValidationError as exc:
        raise validation_error(exc) from exc
    if isinstance(event, Pong):
        return WebhookOutcome(HTTPStatus.OK, {"pong": True})
    if isinstance(event, Ignored):
        return WebhookOutcome(HTTPStatus.ACCEPTED, {"ignored": event.reason})
    if event.repo.lower() != project.repo.lower():
        return WebhookOutcome(HTTPStatus.ACCEPTED, {"ignored": f"repository {event.repo} is not {project.repo}"})
    fork_policy = project.fork_pull_requests if event.fork is not None else ForkPolicy.RUN
    if fork_policy is ForkPolicy.IGNORE:
        return WebhookOutcome(
            HTTPStatus.ACCEPTED,
            {
                "ignored": f"pull request #{event.pull_request_number} comes from fork {event.fork}; "
                f"the project's fork_pull_requests is {fork_policy.value}"
            },
        )
    trigger = Trigger(type=TriggerType.WEBHOOK, source=event.source, delivery_id=event.delivery_id, actor=event.actor)
    result = enqueue(
        settings, project, trigger, ref=event.ref, commit=event.commit, identity=event.commit,
        held_reason=HeldReason.FORK_PULL_REQUEST if fork_policy is ForkPolicy.HOLD else None,
    )
    status = HTTPStatus.OK if result.duplicate else HTTPStatus.ACCEPTED
    return WebhookOutcome(status, result.body())


def receive_github(
    settings: IntakeSettings, project_id: str, headers: Mapping[str, str], raw_body: bytes
) -> WebhookOutcome:
    def verify(project: Project, lower: dict[str, str]) -> None:
        secret = _secret(settings, project.webhook.github_secret_ref)
        github.verify_signature(secret, raw_body, lower.get(github.SIGNATURE_HEADER))

    def parse(lower: dict[str, str], payload: dict[str, Any]) -> GitTrigger | Ignored | Pong:
        return github.parse_github(lower.get(github.EVENT_HEADER, ""), lower.get(github.DELIVERY_HEADER), payload)

    return record_incoming(
        settings.table_name, settings.delivery_record_days, "github", project_id, headers, github.EVENT_HEADER,
        github.DELIVERY_HEADER, lambda: _receive(settings, project_id, headers, raw_body, verify, parse),
    )


def receive_gitlab(
    settings: IntakeSettings, project_id: str, headers: Mapping[str, str], raw_body: bytes
) -> WebhookOutcome:
    def verify(project: Project, lower: dict[str, str]) -> None:
        secret = _secret(settings, project.webhook.gitlab_token_ref)
        gitlab.verify_token(secret, lower.get(gitlab.TOKEN_HEADER))

    def parse(lower: dict[str, str], payload: dict[str, Any]) -> GitTrigger | Ignored | Pong:
        return gitlab.parse_gitlab(lower.get(gitlab.EVENT_HEADER, ""), lower.get(gitlab.DELIVERY_HEADER), payload)

    return record_incoming(
        settings.table_name, settings.delivery_record_days, "gitlab", project_id, headers, gitlab.EVENT_HEADER,
        gitlab.DELIVERY_HEADER, lambda: _receive(settings, project_id, headers, raw_body, verify, parse),
    )
