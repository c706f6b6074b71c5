"""The outbox: reports that must reach AWS. A stage's report is journaled with its outcome (one
SQLite transaction, relevo_agent.journal) before it is sent, and stays in the journal until the
region's outcome route has made the fenced stage write and answered the run token; what the
network lost is sent again by a loop of its own, oldest first.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from relevo_agent.attempt import StageReport
from relevo_agent.claim_routes import RouteError, RouteUnreachable
from relevo_agent.job_sessions import AttemptKey, JobSessions
from relevo_agent.journal import Journal
from relevo_agent.reachability import stack as reachability
from relevo_core.aws import call_budget
from relevo_core.models.errors import ErrorCode

if TYPE_CHECKING:
    from relevo_agent.stop import AgentStop

log = logging.getLogger(__name__)

# One report's round trip to the outcome route (a failed send is tried again by the loop).
REPORT_CALL_SEC = 10.0


class Outbox:
    """`stop`: the agent's. `sessions`: the job credentials of the attempts this agent holds
    (let go once an attempt's report is sent) and the claim routes the reports go to."""

    def __init__(
        self,
        journal: Journal,
        table_name: str,
        agent_id: str,
        stop: AgentStop,
        sessions: JobSessions,
    ) -> None:
        self.journal = journal
        self.table_name = table_name
        self.agent_id = agent_id
        self.sessions = sessions
        self._stop = stop
        self._lock = threading.Lock()
        # The reports whose deferral was said: each is said once, its retries while the stack
        # does not answer are not (relevo_agent.reachability).
        self._deferred: set[tuple[str, str, int]] = set()

    def flush(self) -> int:
        """Send what the journal holds unsent, oldest first; stop at the first network failure.
        Returns how many reports are still waiting."""
        with self._lock:
            for entry in self.journal.pending():
                if self._send(StageReport.model_validate(entry.payload)):
                    self.journal.sent(entry.id)
                else:
                    self.journal.failed_to_send(entry.id)
                    break
            return len(self.journal.pending())

    def run_forever(self, interval_sec: float) -> None:
        while True:
            time.sleep(interval_sec)
            try:
                self.flush()
            except Exception:
                log.exception("outbox flush failed")

    def _send(self, report: StageReport) -> bool:
        """One report, to the region's outcome route: the fenced stage write and the answer on the
        run token, both made by the route for the claim that shows this attempt's claim secret
        (the agent holds no task token and no task power). True when done with it (recorded, or
        refused for good); False to try again later. Done, its attempt's credentials are let go."""
        key = AttemptKey(report.job_id, report.stage_index, report.attempt, report.shard)
        done = self._report(report)
        if done:
            self.sessions.release(key)
            self._deferred.discard((report.job_id, report.stage, report.attempt))
        return done

    def _report(self, report: StageReport) -> bool:
        from relevo_core.models.agent_session import TASK_CAUSE_MAX, OutcomeReport

        routes = self.sessions.routes
        if routes is None or not report.claim_secret:
            log.warning(
                "%s:%s attempt %d: report dropped, no claim route or claim secret to send it with",
                report.job_id,
                report.stage,
                report.attempt,
            )
            return True
        request = OutcomeReport(
            job_id=report.job_id,
            stage_index=report.stage_index,
            shard=report.shard,
            attempt=report.attempt,
            agent_id=self.agent_id,
            claim_secret=report.claim_secret,
            status=report.status.value,
            outcome=report.outcome.value,
            exit_code=report.exit_code,
            error=report.error,
            cause=(report.cause or "")[:TASK_CAUSE_MAX] or None,
            receipt=report.receipt,
            lease_ended=report.lease_ended,
            tests=report.tests,
        )
        try:
            with call_budget(REPORT_CALL_SEC):
                routes.report(request)
        except RouteError as refused:
            if refused.code == ErrorCode.RUN_NOT_HANDED.value:
                # Recorded; never handed a run token: the state machine's timeouts decide.
                return True
            if refused.code == ErrorCode.TASK_GONE.value:
                log.warning(
                    "%s:%s attempt %d: the execution no longer waits for this report",
                    report.job_id,
                    report.stage,
                    report.attempt,
                )
                return True
            if refused.no_longer_held:
                log.warning(
                    "%s:%s attempt %d: report refused, %s",
                    report.job_id,
                    report.stage,
                    report.attempt,
                    refused.message,
                )
                return True
            if refused.status in (401, 403):
                # The route's IAM check: the agent's own credentials, not this report, are at fault.
                self._defer(report, str(refused), refused)
                return False
            log.error(
                "%s:%s attempt %d: report refused for good (%s)",
                report.job_id,
                report.stage,
                report.attempt,
                refused,
            )
            return True
        except RouteUnreachable as exc:
            self._defer(report, str(exc), exc)
            return False
        return True

    def _defer(self, report: StageReport, why: str, exc: BaseException) -> None:
        """Say that a report waits in the outbox: once per report, and again only for a failure
        that says more than that the stack did not answer."""
        key = (report.job_id, report.stage, report.attempt)
        quiet = reachability.failed(exc) and key in self._deferred
        self._deferred.add(key)
        if not quiet:
            log.warning(
                "report of %s:%s attempt %d deferred to the outbox (%s)",
                report.job_id,
                report.stage,
                report.attempt,
                why,
            )
