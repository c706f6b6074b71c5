"""A webhook delivery, from raw bytes to a job: verify, read, decide, enqueue."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Mapping

from aws_lambda_powertools.utilities import parameters
from pydantic import ValidationError

from relevo_core.config import IntakeSettings
from relevo_core.intake import enqueue
from relevo_core.models.envelope import Trigger, TriggerType, validation_error
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.store.projects import get_project
from relevo_core.webhooks import github

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


def receive_github(
    settings: IntakeSettings, project_id: str, headers: Mapping[str, str], raw_body: bytes
) -> WebhookOutcome:
    if len(raw_body) > MAX_BODY_BYTES:
        raise RelevoError(ErrorCode.PAYLOAD_TOO_LARGE, f"body is over {MAX_BODY_BYTES} bytes")
    lower = {name.lower(): value for name, value in headers.items()}
    project = get_project(settings.table_name, project_id)
    github.verify_signature(_secret(settings, project.webhook.github_secret_ref), raw_body, lower.get(github.SIGNATURE_HEADER))
    try:
        payload = json.loads(raw_body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RelevoError(ErrorCode.MALFORMED_JSON, f"body is not JSON: {exc}") from exc

    event = lower.get(github.EVENT_HEADER, "")
    if event == "ping":
        return WebhookOutcome(HTTPStatus.OK, {"pong": True})
    if event != "push":
        return WebhookOutcome(HTTPStatus.ACCEPTED, {"ignored": f"event {event or '(none)'} does not start jobs"})
    try:
        push = github.PushEvent.model_validate(payload)
    except ValidationError as exc:
        raise validation_error(exc) from exc
    if push.repository.full_name.lower() != project.repo.lower():
        return WebhookOutcome(
            HTTPStatus.ACCEPTED, {"ignored": f"repository {push.repository.full_name} is not {project.repo}"}
        )
    if push.is_deletion:
        return WebhookOutcome(HTTPStatus.ACCEPTED, {"ignored": f"{push.ref} was deleted"})

    trigger = Trigger(type=TriggerType.WEBHOOK, source="github", delivery_id=lower.get(github.DELIVERY_HEADER))
    result = enqueue(settings, project, trigger, ref=push.ref, commit=push.after)
    if result.duplicate:
        return WebhookOutcome(HTTPStatus.OK, {"job_id": result.job_id, "duplicate": True})
    return WebhookOutcome(HTTPStatus.ACCEPTED, {"job_id": result.job_id, "duplicate": False})
