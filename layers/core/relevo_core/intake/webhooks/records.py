"""Incoming delivery records: every webhook delivery Relevo answered, with what it answered
(accepted: a job; duplicate: an earlier delivery's job; ignored, with the reason; refused, with
the error code). Recording never changes the answer: a failed write is logged, and the delivery
is answered as it would have been."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from http import HTTPStatus
from typing import Any, Callable, Mapping

from relevo_core.models.delivery import DeliveryRecord, Direction, Outcome
from relevo_core.models.envelope import PROJECT_ID
from relevo_core.models.errors import RelevoError
from relevo_core.observability import logger
from relevo_core.store.deliveries import record_delivery

DAY = 86_400


def record_incoming(
    table: str, record_days: int, source: str, project_id: str, headers: Mapping[str, str],
    event_header: str, delivery_header: str, answer: Callable[[], Any],
) -> Any:
    """Run `answer` (the intake of one delivery) and record what it answered; re-raise a refusal."""
    lower = {k.lower(): v for k, v in headers.items()}
    event = lower.get(event_header) or "unknown"
    delivery_id = lower.get(delivery_header)
    try:
        outcome = answer()
    except RelevoError as exc:
        _record(table, record_days, source, project_id, event, delivery_id, Outcome.REFUSED, int(exc.status), exc.code.value)
        raise
    body = getattr(outcome, "body", {}) or {}
    status = int(getattr(outcome, "status", HTTPStatus.OK))
    if body.get("pong"):
        kind, reason = Outcome.IGNORED, "ping"
    elif "ignored" in body:
        kind, reason = Outcome.IGNORED, str(body["ignored"])
    elif body.get("duplicate"):
        kind, reason = Outcome.DUPLICATE, f"job {body.get('job_id')}"
    else:
        kind, reason = Outcome.ACCEPTED, body.get("outcome")
    _record(table, record_days, source, project_id, event, delivery_id, kind, status, reason, body.get("job_id"))
    return outcome


def _record(table: str, record_days: int, source: str, project_id: str, event: str, delivery_id: str | None,
            outcome: Outcome, status: int, reason: str | None, job_id: str | None = None) -> None:
    if not re.fullmatch(PROJECT_ID, project_id):
        return  # not a project id at all: no partition is made for it
    now = datetime.now(timezone.utc)
    record = DeliveryRecord(
        direction=Direction.INCOMING, project=project_id, target=f"webhook:{source}", event=event[:64], outcome=outcome,
        at=now.isoformat(timespec="milliseconds"), http_status=status, job_id=job_id,
        delivery_id=(delivery_id or None) and delivery_id[:128], reason=None if reason is None else str(reason)[:512],
    )
    try:
        record_delivery(table, record, ttl=int(now.timestamp()) + record_days * DAY)
    except Exception:  # the answer stands whether or not it was recorded
        logger.exception("webhook delivery not recorded", extra={"project": project_id, "delivery_id": delivery_id})
