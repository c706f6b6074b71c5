"""What Relevo keeps of a refused webhook delivery: a metric and a log line for each (incoming.py),
and at most one stored record per project and minute, for whoever debugs a wrong webhook secret
(`relevo deliveries --project P --failed` shows the minute's first refusal and its code).

A refused delivery is unauthenticated (a forged signature, no secret) or unreadable (malformed
JSON, a body over 1 MiB), so its sender must not be able to make Relevo write at will. Hence:
- the first refusal of a project's minute in a container makes one conditional PutItem, keyed by
  the minute (store.deliveries.record_refusal_of_minute); every other refusal of that minute in
  that container makes no AWS call at all;
- a second container's write of the same minute is refused by the condition and stores nothing;
  so at most one record per project and minute is stored whoever sends what, and at most one call
  per project and minute is made by each warm container (WebhookFunction's reserved concurrency
  caps how many there are);
- nothing is stored for a project id that names no project (no partition is made for it), nor for
  a body refused for its size before this container has read the project.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

from relevo_core.config import IntakeSettings
from relevo_core.intake.webhooks.incoming import IncomingDelivery, count_refusal
from relevo_core.models.errors import RelevoError
from relevo_core.observability import logger


def _utc_now() -> datetime:
    return datetime.now(UTC)


def minute_of(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


class RefusalMinutes:
    """The minute of the last record of refusals this container made for each project."""

    def __init__(self, clock: Callable[[], datetime] = _utc_now) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._minutes: dict[tuple[str, str], datetime] = {}

    def due(self, table: str, project_id: str) -> bool:
        """Would a refusal for the project now make the minute's record? (no call, nothing taken)"""
        with self._lock:
            return self._minutes.get((table, project_id)) != minute_of(self.clock())

    def take(self, table: str, project_id: str, moment: datetime) -> bool:
        """True once per project and minute: the caller makes the minute's record."""
        minute = minute_of(moment)
        with self._lock:
            if self._minutes.get((table, project_id)) == minute:
                return False
            self._minutes[(table, project_id)] = minute
            return True

    def clear(self) -> None:
        with self._lock:
            self._minutes.clear()


refusal_minutes = RefusalMinutes()


def note_refusal(
    settings: IntakeSettings, delivery: IncomingDelivery, error: RelevoError, project_known: bool
) -> None:
    """Count and log a refused delivery; store it if it is its project's first refusal of the
    minute here. `project_known`: the project exists (this container has read it). Never raises:
    the refusal is answered as it is, recorded or not."""
    count_refusal(delivery, error.code.value, int(error.status))
    if not project_known:
        return
    now = refusal_minutes.clock()
    if not refusal_minutes.take(settings.table_name, delivery.project_id, now):
        return
    try:
        # Once a minute at most: the record's model and store are imported for it only.
        from relevo_core.intake.webhooks.records import record_refusal

        record_refusal(settings, delivery, error, now)
    except Exception:  # the answer stands whether or not it was recorded
        logger.exception("refused webhook delivery not recorded", extra=delivery.fields())
