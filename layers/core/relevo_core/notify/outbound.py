"""A report's way out, shared by the status reporter (relevo_core.notify.reporter) and the group
channels (relevo_core.notify.groups): its claim (a marker, so a repeat of the record sends nothing),
its send with retries (notify.sending), a delivery record for every attempt (store.deliveries),
and, when it fails, its dead letter on the reporter's queue; and the lookups a report is addressed
by (a project, a group, a secret).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from relevo_core.config.notify import NotifySettings
from relevo_core.execution import send_report_dead_letter
from relevo_core.models.delivery import DeliveryRecord, Direction, Outcome
from relevo_core.models.group import Group
from relevo_core.models.project import Project
from relevo_core.notify.report import Report
from relevo_core.notify.sending import Clock, OutgoingRequest, SendPolicy, SendResult, Transport, send
from relevo_core.notify.transitions import JobTransition, job_link
from relevo_core.observability import logger
from relevo_core.store.deliveries import record_delivery
from relevo_core.store.notices import claim_notice, finish_notice

DAY = 86_400


@dataclass
class Outbound:
    settings: NotifySettings
    transport: Transport
    clock: Clock
    # A project by id (None once it is deleted), a group by name (None: not defined), a secret's value by
    # name.
    project: Callable[[str], Project | None]
    secret: Callable[[str], str]
    group: Callable[[str], Group | None] = lambda _name: None
    # Every registered project (read only for a change that is about no one project: agents).
    projects: Callable[[], list[Project]] = list
    # Claims taken for the change being reported that nothing was sent under yet (see
    # Reporter.report_change, which gives them back when the change fails half-way).
    _held: list[Report] = field(default_factory=list, init=False, repr=False)

    @property
    def policy(self) -> SendPolicy:
        s = self.settings
        return SendPolicy(
            s.connect_timeout_sec, s.read_timeout_sec, s.attempts, s.send_budget_sec, s.backoff_base_sec
        )

    def link(self, transition: JobTransition, project: Project) -> str:
        return job_link(transition, self.settings.machines, project.console_url)

    def claim(self, report: Report) -> bool:
        now = int(self.clock.now())
        # A claim outlives one delivery's budget: the invocation that took it is surely gone after.
        claim_sec = int(self.settings.send_budget_sec) + 60
        taken = claim_notice(
            self.settings.table_name,
            report.subject,
            report.target,
            report.key,
            now,
            claim_sec,
            ttl=now + self.settings.notice_memory_days * DAY,
        )
        if taken:
            self._held.append(report)
        return taken

    def deliver(
        self, report: Report, request: OutgoingRequest, deadline: float, claimed: bool = True
    ) -> SendResult:
        """Send a report, record its attempts, dead-letter it when it fails."""
        self._let_stand(report)  # from its first send on, its claim is never given back
        result = send(request, self.policy, self.transport, self.clock, deadline)
        for attempt in result.attempts:
            if attempt.error is None:
                outcome = Outcome.DELIVERED
            else:
                outcome = (
                    Outcome.FAILED if attempt is result.last and not result.delivered else Outcome.RETRYING
                )
            self.record(
                report,
                outcome,
                attempt.number,
                attempt.http_status,
                attempt.latency_ms,
                attempt.error,
                attempt.ended_at,
            )
        if result.delivered:
            if claimed:
                finish_notice(self.settings.table_name, report.subject, report.target, report.key, "sent")
        else:
            self.give_up(report, request, result.reason or "failed", result, recorded=True, claimed=claimed)
        return result

    def _let_stand(self, report: Report) -> None:
        self._held[:] = [held for held in self._held if held is not report]

    def record(
        self,
        report: Report,
        outcome: Outcome,
        attempt: int,
        http_status: int | None,
        latency_ms: int | None,
        reason: str | None,
        at: float,
    ) -> None:
        when = datetime.fromtimestamp(at, UTC)
        record = DeliveryRecord(
            direction=Direction.OUTGOING,
            project=report.project,
            job_id=report.job_id,
            target=report.target.split(":")[0],
            event=report.event,
            outcome=outcome,
            at=when.isoformat(timespec="milliseconds"),
            http_status=http_status,
            attempt=attempt,
            latency_ms=latency_ms,
            reason=None if reason is None else reason[:512],
        )
        record_delivery(
            self.settings.table_name, record, ttl=int(at) + self.settings.delivery_record_days * DAY
        )

    def give_up(
        self,
        report: Report,
        request: OutgoingRequest | None,
        reason: str,
        result: SendResult | None = None,
        recorded: bool = False,
        claimed: bool = True,
    ) -> None:
        if not recorded:
            self.record(report, Outcome.FAILED, 1, None, None, reason, self.clock.now())
        message = {
            "event": report.detail,
            "target": report.target,
            # The request as sent, less its headers (they carry the token) and a secret URL.
            "request": None
            if request is None
            else {"method": request.method, "url": request.shown_url, "body": request.body},
            "failure": {
                "reason": reason,
                "attempts": [
                    {
                        "attempt": a.number,
                        "http_status": a.http_status,
                        "error": a.error,
                        "latency_ms": a.latency_ms,
                    }
                    for a in (result.attempts if result else ())
                ],
            },
        }
        send_report_dead_letter(self.settings.dead_letter_queue_url, message)
        if claimed:
            finish_notice(
                self.settings.table_name, report.subject, report.target, report.key, "dead_lettered"
            )
        logger.warning(
            "report dead-lettered",
            extra={"subject": report.subject, "target": report.target, "reason": reason},
        )
