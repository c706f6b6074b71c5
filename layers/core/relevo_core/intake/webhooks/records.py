"""Delivery records of incoming webhook deliveries (`relevo deliveries`): what Relevo answered.

- accepted (a job, or a job held for an operator): written in the job's own transaction
  (`accepted_put`, given to enqueue), so it costs no call and exists exactly when the job does;
- ignored (a ping, another repository, an event or a fork pull request that starts nothing): one
  PutItem; the delivery was authenticated, so only the secret's holder can cause it;
- refused: at most one per project and minute (refusals.py, `record_refusal`);
- a duplicate is counted and logged, not stored: its one call is the cancelled transaction that
  found the job it duplicates, and storing it would take a second.

Recording never changes the answer: a failed write is logged, and the delivery is answered as it
would have been.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from http import HTTPStatus
from typing import Any

from relevo_core.config import IntakeSettings
from relevo_core.intake.webhooks.incoming import IncomingDelivery
from relevo_core.models.delivery import DeliveryRecord, Direction, Outcome
from relevo_core.models.errors import RelevoError
from relevo_core.models.status import HeldReason
from relevo_core.observability import logger
from relevo_core.store.deliveries import delivery_put, record_delivery, record_refusal_of_minute

DAY = 86_400
REASON_CHARS = 512


def incoming_record(
    delivery: IncomingDelivery,
    outcome: Outcome,
    http_status: int,
    reason: str | None,
    at: datetime,
    job_id: str | None = None,
) -> DeliveryRecord:
    return DeliveryRecord(
        direction=Direction.INCOMING,
        project=delivery.project_id,
        target=f"webhook:{delivery.source}",
        event=delivery.event,
        outcome=outcome,
        at=at.isoformat(timespec="milliseconds"),
        http_status=http_status,
        job_id=job_id,
        delivery_id=delivery.delivery_id,
        reason=None if reason is None else reason[:REASON_CHARS],
    )


def _ttl(settings: IntakeSettings, at: datetime) -> int:
    return int(at.timestamp()) + settings.delivery_record_days * DAY


def accepted_put(
    settings: IntakeSettings, delivery: IncomingDelivery, at: datetime
) -> Callable[[str, HeldReason | None], dict[str, Any]]:
    """For enqueue: the Put of the accepted delivery's record, given the job's id and whether it
    is held. If the execution then fails to start, the job stays queued for the sweep to start
    (recovery.sweeper): the record says what the delivery made, a job."""

    def put(job_id: str, held: HeldReason | None) -> dict[str, Any]:
        record = incoming_record(
            delivery, Outcome.ACCEPTED, HTTPStatus.ACCEPTED, "held" if held else None, at, job_id
        )
        return delivery_put(settings.table_name, record, _ttl(settings, at))

    return put


def record_ignored(
    settings: IntakeSettings, delivery: IncomingDelivery, http_status: int, reason: str, at: datetime
) -> None:
    try:
        record_delivery(
            settings.table_name,
            incoming_record(delivery, Outcome.IGNORED, http_status, reason, at),
            _ttl(settings, at),
        )
    except Exception:  # the answer stands whether or not it was recorded
        logger.exception("webhook delivery not recorded", extra=delivery.fields())


def record_refusal(
    settings: IntakeSettings, delivery: IncomingDelivery, error: RelevoError, at: datetime
) -> bool:
    """The record of the project's refusals of `at`'s minute, unless one is stored already."""
    record = incoming_record(delivery, Outcome.REFUSED, int(error.status), error.code.value, at)
    return record_refusal_of_minute(settings.table_name, record, _ttl(settings, at), at)
