"""One incoming webhook delivery as Relevo names it in its metrics, log lines and delivery records,
and the metric and log line each answer gets.

What is named: the sender, the project id the URL gives (as a project only when it has a project
id's shape), the event and delivery id headers (trimmed) and the body's size. Never the body, a
signature, a token or a secret: a refused delivery's answer carries its message to the sender
(GitHub shows it under the webhook's Recent Deliveries), the log line only its code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from relevo_core.models.shapes import PROJECT_ID
from relevo_core.observability import logger, metrics

# The metrics (namespace Relevo, dimension service; WebhookRefused also by Reason, the error code).
ACCEPTED = "WebhookAccepted"
DUPLICATE = "WebhookDuplicates"
IGNORED = "WebhookIgnored"
REFUSED = "WebhookRefused"

EVENT_CHARS = 64
DELIVERY_ID_CHARS = 128


@dataclass(frozen=True)
class IncomingDelivery:
    source: str  # github | gitlab
    project_id: str  # as the URL gives it: not necessarily a project
    event: str  # the event header, trimmed; "unknown" without one
    delivery_id: str | None  # the delivery id header, trimmed
    body_bytes: int

    @classmethod
    def read(
        cls,
        source: str,
        project_id: str,
        lower_headers: Mapping[str, str],
        event_header: str,
        delivery_header: str,
        body_bytes: int,
    ) -> IncomingDelivery:
        event = (lower_headers.get(event_header) or "unknown")[:EVENT_CHARS]
        delivery_id = (lower_headers.get(delivery_header) or "")[:DELIVERY_ID_CHARS] or None
        return cls(source, project_id, event, delivery_id, body_bytes)

    @property
    def names_a_project(self) -> bool:
        return re.fullmatch(PROJECT_ID, self.project_id) is not None

    def fields(self) -> dict[str, Any]:
        """What a log line says of the delivery."""
        return {
            "source": self.source,
            "project": self.project_id if self.names_a_project else None,
            "event": self.event,
            "delivery_id": self.delivery_id,
            "body_bytes": self.body_bytes,
        }


def count(metric: str, delivery: IncomingDelivery, message: str, **extra: Any) -> None:
    """One delivery answered: its metric (flushed when the invocation ends) and its log line."""
    metrics.add_metric(name=metric, unit=MetricUnit.Count, value=1)
    logger.info(message, extra={**delivery.fields(), **extra})


def count_refusal(delivery: IncomingDelivery, code: str, http_status: int) -> None:
    """A refused delivery: WebhookRefused in all and by Reason, and a warning with the code."""
    metrics.add_metric(name=REFUSED, unit=MetricUnit.Count, value=1)
    with single_metric(name=REFUSED, unit=MetricUnit.Count, value=1, namespace=metrics.namespace) as metric:
        metric.add_dimension(name="Reason", value=code)
    logger.warning(
        "webhook delivery refused", extra={**delivery.fields(), "reason": code, "http_status": http_status}
    )
