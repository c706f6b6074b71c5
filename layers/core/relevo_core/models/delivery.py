"""Delivery records: every outgoing commit status or notification, every incoming webhook delivery."""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic would
# otherwise parse and evaluate each one again, at cold start, to build the models.

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Direction(str, Enum):
    OUTGOING = "outgoing"
    INCOMING = "incoming"


class Outcome(str, Enum):
    # outgoing
    DELIVERED = "delivered"
    RETRYING = "retrying"  # this attempt failed, another follows
    FAILED = "failed"  # the last attempt failed: the event went to the dead-letter queue
    # not sent: a newer transition of the job was already reported to the target (a late replay)
    SUPERSEDED = "superseded"
    # incoming (the webhook intake's answers)
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    IGNORED = "ignored"
    REFUSED = "refused"

    @property
    def failed(self) -> bool:
        return self in {Outcome.RETRYING, Outcome.FAILED, Outcome.REFUSED}


class DeliveryRecord(BaseModel):
    """One attempt of one delivery. Never holds a URL's secret part, a token or a body."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    direction: Direction
    project: str
    target: str = Field(
        description="github_status, gitlab_status, slack, email; incoming: webhook:github, webhook:gitlab"
    )
    event: str = Field(
        description="The transition or notification event (running, succeeded, job_waiting, push, ...)"
    )
    outcome: Outcome
    at: str = Field(description="When the attempt ended (ISO 8601, UTC)")
    job_id: str | None = None
    http_status: int | None = None
    attempt: int = Field(default=1, ge=1)
    latency_ms: int | None = Field(default=None, ge=0)
    reason: str | None = Field(
        default=None,
        max_length=512,
        description="Why it failed, was ignored or refused (an error code or a short text)",
    )
    delivery_id: str | None = None


# Built on first use (defer_build): only the status reporter reads a replay.
class ReportReplay(BaseModel):
    """A by-hand replay of StatusReporterFunction (`aws lambda invoke --payload`): messages of
    StatusDeadLetterQueue, each as the reporter wrote it (its `event`, `target`, `request`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    replay: list[dict[str, Any]] = Field(min_length=1, max_length=100)
