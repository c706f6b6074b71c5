"""The outbox: reports that must reach AWS. A stage's report is journaled with its outcome (one
SQLite transaction, relevo_agent.journal) before it is sent, and stays in the journal until the
fenced stage write and the answer on the run token are done; what the network lost is sent again
by a loop of its own, oldest first.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from relevo_agent.attempt import DEAD_TOKEN, StageReport, utc_now
from relevo_agent.claim_routes import RouteUnreachable
from relevo_agent.job_sessions import AttemptKey, AttemptNotHeld, JobSessions
from relevo_agent.journal import Journal
from relevo_agent.reachability import stack as reachability
from relevo_core.aws import client, error_code, job_scope
from relevo_core.models.errors import ErrorClass
from relevo_core.store import stage_attempts

if TYPE_CHECKING:
    from relevo_agent.stop import AgentStop

log = logging.getLogger(__name__)


class Outbox:
    """`stop`: the agent's (a failed send that says the stack no longer exists stops it).
    `sessions`: the job credentials each report is sent with (resumed with the report's claim
    secret when the agent restarted since)."""

    def __init__(
        self, journal: Journal, table_name: str, agent_id: str, stop: AgentStop, sessions: JobSessions,
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
        """One report, with its job's credentials. True when done with it (sent, or refused for
        good); False to try again later. Done, its attempt's credentials are let go."""
        key = AttemptKey(report.job_id, report.stage_index, report.attempt, report.shard)
        try:
            credentials = self.sessions.for_attempt(key, report.claim_secret)
        except AttemptNotHeld as refused:
            log.warning("%s:%s attempt %d: report dropped, %s", report.job_id, report.stage, report.attempt, refused)
            return True
        except RouteUnreachable as exc:
            self._defer(report, f"no job credentials yet: {exc}", exc)
            return False
        with job_scope(credentials):
            done = self._send_as_job(report)
        if done:
            self.sessions.release(key)
            self._deferred.discard((report.job_id, report.stage, report.attempt))
        return done

    def _send_as_job(self, report: StageReport) -> bool:
        """The fenced stage write, then the task token. True when done with it (sent, or refused
        for good because another attempt owns the stage); False to try again later."""
        ref = stage_attempts.StageRef(self.table_name, report.job_id, report.stage_index, report.attempt, self.agent_id, shard=report.shard)
        status = report.status
        try:
            stage_attempts.finish(
                ref, status, utc_now(), report.exit_code, report.error,
                receipt=report.receipt, outcome=report.outcome, lease_ended=report.lease_ended,
            )
        except stage_attempts.LeaseLost:
            log.warning("%s:%s attempt %d: report refused, another attempt holds the stage", report.job_id, report.stage, report.attempt)
            return True
        except (BotoCoreError, ClientError) as exc:
            self._stop.stack_gone(exc)
            self._defer(report, str(exc), exc)
            return False
        token = report.run_token or _stored_run_token(ref)
        if not token:
            return True  # never handed this attempt: the state machine's timeouts decide
        sfn = client("stepfunctions")
        try:
            if status.succeeded:
                # The state machine keeps each stage's output (the job record's stage_outcomes): a
                # `warning` stage is said there for the job's commit status.
                output = {"stage": report.stage, "attempt": report.attempt, "agent_id": self.agent_id, "status": status.value}
                sfn.send_task_success(taskToken=token, output=json.dumps(output))
            else:
                sfn.send_task_failure(taskToken=token, error=report.error or ErrorClass.COMMAND_FAILED.value, cause=report.cause or "")
        except ClientError as exc:
            if error_code(exc) in DEAD_TOKEN:
                log.warning("%s:%s attempt %d: the execution no longer waits for this report", report.job_id, report.stage, report.attempt)
                return True
            self._defer(report, str(exc), exc)
            return False
        except BotoCoreError as exc:
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
            log.warning("report of %s:%s attempt %d deferred to the outbox (%s)", report.job_id, report.stage, report.attempt, why)


def _stored_run_token(ref: stage_attempts.StageRef) -> str | None:
    """The run token on the stage record, for a report journaled before the token was known."""
    try:
        return stage_attempts.run_token(ref)
    except (stage_attempts.LeaseLost, ClientError, BotoCoreError):
        return None
