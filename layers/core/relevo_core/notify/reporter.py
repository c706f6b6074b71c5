"""The status reporter: one table change in, at most one report per target and transition out.

Order for each report: claim its marker (store.notices: a repeat of the record stops here), read
the token, send with retries (notify.sending), record every attempt (store.deliveries), and on
failure put the event and the failure on the reporter's dead-letter queue. Nothing here raises
for a remote service's failure: the job never waits for, nor fails by, its reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from relevo_core.aws import client
from relevo_core.config.notify import NotifySettings
from relevo_core.models.delivery import DeliveryRecord, Direction, Outcome
from relevo_core.models.project import Project
from relevo_core.notify.commit_status import status_request, wants_report
from relevo_core.notify.sending import Clock, OutgoingRequest, SendPolicy, SendResult, Transport, send
from relevo_core.notify.transitions import JobTransition, job_link, job_transition
from relevo_core.observability import logger
from relevo_core.store.deliveries import record_delivery
from relevo_core.store.notices import claim_notice, finish_notice

DAY = 86_400


@dataclass
class Reporter:
    settings: NotifySettings
    transport: Transport
    clock: Clock
    # A project by id (None once it is deleted), a secret's value by name.
    project: Callable[[str], Project | None]
    secret: Callable[[str], str]

    @property
    def policy(self) -> SendPolicy:
        s = self.settings
        return SendPolicy(s.connect_timeout_sec, s.read_timeout_sec, s.attempts, s.send_budget_sec, s.backoff_base_sec)

    def report_change(self, old: dict[str, Any] | None, new: dict[str, Any] | None, deadline: float) -> None:
        transition = job_transition(old, new)
        if transition is None:
            return
        project = self.project(transition.project)
        if project is None or project.commit_status is None or not wants_report(transition, project.commit_status):
            return
        settings = project.commit_status
        target = f"{settings.provider}_status"
        if not self._claim(transition, target):
            return
        try:
            token = self.secret(settings.token_ref)
        except Exception as exc:  # a missing or unreadable secret: the report is dead-lettered, the job goes on
            self._give_up(transition, target, None, f"the token {settings.token_ref} cannot be read ({type(exc).__name__})")
            return
        link = job_link(transition, self.settings.state_machine_arn, project.console_url)
        request = status_request(transition, settings, project.repo, token, link)
        if request is not None:
            self.deliver(transition, request, deadline)

    def _claim(self, transition: JobTransition, target: str) -> bool:
        now = int(self.clock.now())
        # A claim outlives one delivery's budget: the invocation that took it is surely gone after.
        claim_sec = int(self.settings.send_budget_sec) + 60
        return claim_notice(
            self.settings.table_name, transition.job_id, target, transition.key, now, claim_sec,
            ttl=now + self.settings.notice_memory_days * DAY,
        )

    def deliver(self, transition: JobTransition, request: OutgoingRequest, deadline: float, event: str | None = None) -> SendResult:
        """Send a claimed report, record its attempts, dead-letter it when it fails."""
        result = send(request, self.policy, self.transport, self.clock, deadline)
        for attempt in result.attempts:
            if attempt.error is None:
                outcome = Outcome.DELIVERED
            else:
                outcome = Outcome.FAILED if attempt is result.last and not result.delivered else Outcome.RETRYING
            self._record(transition, request.target, event or transition.key.split("#")[0], outcome, attempt.number,
                         attempt.http_status, attempt.latency_ms, attempt.error, attempt.ended_at)
        if result.delivered:
            finish_notice(self.settings.table_name, transition.job_id, request.target, transition.key, "sent")
        else:
            self._give_up(transition, request.target, request, result.reason or "failed", result, recorded=True)
        return result

    def _record(self, transition: JobTransition, target: str, event: str, outcome: Outcome, attempt: int,
                http_status: int | None, latency_ms: int | None, reason: str | None, at: float) -> None:
        when = datetime.fromtimestamp(at, timezone.utc)
        record = DeliveryRecord(
            direction=Direction.OUTGOING, project=transition.project, job_id=transition.job_id, target=target,
            event=event, outcome=outcome, at=when.isoformat(timespec="milliseconds"), http_status=http_status,
            attempt=attempt, latency_ms=latency_ms, reason=reason,
        )
        record_delivery(self.settings.table_name, record, ttl=int(at) + self.settings.delivery_record_days * DAY)

    def _give_up(self, transition: JobTransition, target: str, request: OutgoingRequest | None, reason: str,
                 result: SendResult | None = None, recorded: bool = False) -> None:
        if not recorded:
            self._record(transition, target, transition.key.split("#")[0], Outcome.FAILED, 1, None, None, reason[:512], self.clock.now())
        message = {
            "event": transition.as_event(),
            "target": target,
            # The request as sent, less its headers (they carry the token).
            "request": None if request is None else {"method": request.method, "url": request.shown_url, "body": request.body},
            "failure": {
                "reason": reason,
                "attempts": [
                    {"attempt": a.number, "http_status": a.http_status, "error": a.error, "latency_ms": a.latency_ms}
                    for a in (result.attempts if result else ())
                ],
            },
        }
        client("sqs").send_message(QueueUrl=self.settings.dead_letter_queue_url, MessageBody=json.dumps(message))
        finish_notice(self.settings.table_name, transition.job_id, target, transition.key, "dead_lettered")
        logger.warning("report dead-lettered", extra={"job_id": transition.job_id, "target": target, "reason": reason})
