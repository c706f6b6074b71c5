"""A verified webhook delivery: what it means (its JSON read into a trigger, an ignore or a ping),
and what Relevo does with it (at most one job, the delivery's record in the job's transaction).

Imported with a container's first verified delivery (receive.py): a container that only refuses
never builds the payload shapes, the job envelope or the job store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from pydantic import ValidationError

from relevo_core.config import IntakeSettings
from relevo_core.intake.enqueue import enqueue
from relevo_core.intake.webhooks.events import GitTrigger, Ignored, Pong
from relevo_core.intake.webhooks.incoming import ACCEPTED, DUPLICATE, IGNORED, IncomingDelivery, count
from relevo_core.intake.webhooks.records import accepted_put, record_ignored
from relevo_core.models.envelope import Trigger, TriggerType, validation_error
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.project import ForkPolicy, Project
from relevo_core.models.status import HeldReason

Parse = Callable[[str, "str | None", object], "GitTrigger | Ignored | Pong"]


def _reader(source: str) -> tuple[str, str, Parse]:
    """The sender's event header, delivery id header and reader. Its payload shapes are imported
    with its first delivery: a container that serves GitHub never builds GitLab's."""
    if source == "gitlab":
        from relevo_core.intake.webhooks import gitlab

        return gitlab.EVENT_HEADER, gitlab.DELIVERY_HEADER, gitlab.parse_gitlab
    from relevo_core.intake.webhooks import github

    return github.EVENT_HEADER, github.DELIVERY_HEADER, github.parse_github


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


def answer(
    settings: IntakeSettings,
    project: Project,
    delivery: IncomingDelivery,
    lower: Mapping[str, str],
    raw_body: bytes,
) -> tuple[HTTPStatus, dict[str, Any]]:
    """The answer to a delivery whose sender is verified; a refusal raises RelevoError."""
    event_header, delivery_header, parse = _reader(delivery.source)
    try:
        event = parse(
            lower.get(event_header, ""),
            lower.get(delivery_header),
            _json(raw_body, lower.get("content-type", "").lower()),
        )
    except ValidationError as exc:
        raise validation_error(exc) from exc
    now = datetime.now(UTC)
    if isinstance(event, Pong):
        return _ignored(settings, delivery, HTTPStatus.OK, {"pong": True}, "ping", now)
    if isinstance(event, Ignored):
        return _ignored(settings, delivery, HTTPStatus.ACCEPTED, {"ignored": event.reason}, event.reason, now)
    if event.repo.lower() != project.repo.lower():
        reason = f"repository {event.repo} is not {project.repo}"
        return _ignored(settings, delivery, HTTPStatus.ACCEPTED, {"ignored": reason}, reason, now)
    fork_policy = project.fork_pull_requests if event.fork is not None else ForkPolicy.RUN
    if fork_policy is ForkPolicy.IGNORE:
        reason = (
            f"pull request #{event.pull_request_number} comes from fork {event.fork}; "
            f"the project's fork_pull_requests is {fork_policy.value}"
        )
        return _ignored(settings, delivery, HTTPStatus.ACCEPTED, {"ignored": reason}, reason, now)
    trigger = Trigger(
        type=TriggerType.WEBHOOK, source=event.source, delivery_id=event.delivery_id, actor=event.actor
    )
    result = enqueue(
        settings,
        project,
        trigger,
        ref=event.ref,
        commit=event.commit,
        identity=event.commit,
        now=now,
        held_reason=HeldReason.FORK_PULL_REQUEST if fork_policy is ForkPolicy.HOLD else None,
        delivery_record=accepted_put(settings, delivery, now),
    )
    body = result.body()
    if result.duplicate:
        count(
            DUPLICATE,
            delivery,
            "webhook delivery is a duplicate",
            job_id=result.job_id,
            outcome=result.outcome,
        )
        return HTTPStatus.OK, body
    count(ACCEPTED, delivery, "webhook delivery accepted", job_id=result.job_id, outcome=result.outcome)
    return HTTPStatus.ACCEPTED, body


def _ignored(
    settings: IntakeSettings,
    delivery: IncomingDelivery,
    status: HTTPStatus,
    body: dict[str, Any],
    reason: str,
    now: datetime,
) -> tuple[HTTPStatus, dict[str, Any]]:
    record_ignored(settings, delivery, int(status), reason, now)
    count(IGNORED, delivery, "webhook delivery ignored", reason=reason)
    return status, body
