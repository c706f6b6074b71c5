"""The status reporter: one table change in, at most one report per target and transition out.

Order for each report: claim its marker (store.notices: a repeat of the record stops here), read
the secret, send with retries (notify.sending), record every attempt (store.deliveries), and on
failure put the event and the failure on the reporter's dead-letter queue; the claim, the send,
the records and the dead letter are notify.outbound's, which the group channels send through too.
Nothing here raises for a remote service's failure: the job never waits for, nor fails by, its reports.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from aws_lambda_powertools.utilities import parameters

from relevo_core.config.notify import notify_settings
from relevo_core.jobs.results_listing import job_failures
from relevo_core.models.delivery import Outcome
from relevo_core.models.errors import RelevoError
from relevo_core.models.project import Project
from relevo_core.models.project_settings import CommitStatusSettings
from relevo_core.models.status import JobStatus
from relevo_core.notify.commit_status import describe, status_request, wants_report
from relevo_core.notify.github_app import (
    MAX_ANNOTATIONS,
    InstallationTokens,
    TokenUnavailable,
    annotation_requests,
    check_run_output_request,
    check_run_request,
    failure_annotations,
    stage_summary,
)
from relevo_core.notify.groups import notify_job, notify_other_change
from relevo_core.notify.outbound import DAY, Outbound
from relevo_core.notify.report import Report, transition_report
from relevo_core.notify.sending import Clock, SendResult, Urllib3Transport
from relevo_core.notify.transitions import (
    REJECTED,
    JobTransition,
    job_transition,
    reported_stage_change,
    transition_from_event,
    with_stage_records,
)
from relevo_core.observability import logger
from relevo_core.store.codec import envelope_of
from relevo_core.store.groups import find_group
from relevo_core.store.job_stages import stage_and_shard_records, stage_records
from relevo_core.store.jobs import get_job_record
from relevo_core.store.keys import is_stage_sk
from relevo_core.store.latest_reports import latest_reported_at, raise_latest_reported
from relevo_core.store.notices import check_run_id, finish_notice, release_notice, remember_check_run
from relevo_core.store.projects import get_project, list_projects

# The failed tests a commit status names at most (as many as fit in its description).
NAMED_FAILURES = 10
SENT, SUPERSEDED, DEAD_LETTERED, NOT_REPLAYABLE = "sent", "superseded", "dead_lettered", "not_replayable"
COMMIT_STATUS_TARGETS = ("github_status", "gitlab_status", "github_check_run")


@dataclass
class Reporter(Outbound):
    """What one change of the table is reported as: a commit status or check run to the forge
    (here), the group's channel notices (relevo_core.notify.groups); both sent through Outbound."""

    tokens: InstallationTokens | None = None
    # A job's record now (None once it is gone): its plan (a check run's summary), and its status,
    # which a replayed report is checked against.
    job_record: Callable[[str], dict[str, Any] | None] = lambda _job_id: None
    # A job's failed tests (GET /jobs/{id}/tests' rows), at most so many: read from its results
    # documents at its end, when its records count failures (jobs.results_listing.job_failures).
    failed_tests: Callable[[str, int], list[dict[str, Any]]] = lambda _job_id, _limit: []
    _failures: dict[str, list[dict[str, Any]]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.tokens is None:
            self.tokens = InstallationTokens(self.transport, self.clock, self.secret)

    def report_change(self, old: dict[str, Any] | None, new: dict[str, Any] | None, deadline: float) -> None:
        """One change of the table. An error that escapes (a DynamoDB error between a claim and its
        send) gives back the claims nothing was sent under, then is raised, so the stream's next
        delivery of the record sends them: left standing until they expired, a claim would have made
        that delivery skip its report, which was then lost. A claim a send began under stands (a
        second send could repeat a Slack message)."""
        self._held.clear()
        self._failures.clear()
        try:
            self._report_change(old, new, deadline)
        except Exception:
            for report in self._held:
                release_notice(self.settings.table_name, report.subject, report.target, report.key)
            raise
        finally:
            self._held.clear()

    def _report_change(self, old: dict[str, Any] | None, new: dict[str, Any] | None, deadline: float) -> None:
        transition = job_transition(old, new)
        if transition is None:
            if new and is_stage_sk(str(new.get("sk", ""))):
                if reported_stage_change(old, new):
                    self._stage_change(old, new, deadline)
            elif new and new.get("sk") != "JOB":
                notify_other_change(self, old, new, deadline, self.projects)
            return
        project = self.project(transition.project)
        if project is None:
            return  # deleted since: nothing to report to
        if project.commit_status is not None or project.group:
            transition = self.with_stages(transition)
        if project.commit_status is not None and wants_report(transition, project.commit_status):
            self._commit_status(transition, project, deadline)
        if project.group:
            notify_job(self, transition, project, deadline)

    def with_stages(self, transition: JobTransition) -> JobTransition:
        """The transition with what its stage records add (one Query of the job's stage partition,
        only when they add something): the commit a run without one resolved at its first
        checkout, and at its end its reconciliations."""
        if transition.commit and not transition.status.terminal:
            return transition
        stages, shards = stage_and_shard_records(self.settings.table_name, transition.job_id)
        transition = with_stage_records(transition, stages, shards)
        if transition.tests is not None and transition.tests[1]:
            # Its failures by name, for the commit status (where they fit) and the run's annotations.
            names = tuple(test["id"] for test in self.failures(transition.job_id)[:NAMED_FAILURES])
            transition = replace(transition, failed_tests=names)
        return transition

    def failures(self, job_id: str) -> list[dict[str, Any]]:
        """The job's failed tests, read once per change of the table."""
        if job_id not in self._failures:
            self._failures[job_id] = self.failed_tests(job_id, MAX_ANNOTATIONS)
        return self._failures[job_id]

    def _commit_status(
        self, transition: JobTransition, project: Project, deadline: float, claimed: bool = True
    ) -> str | None:
        """The report's outcome (sent, superseded, dead_lettered; None: another took it). `claimed`
        False: a replay, which takes no marker (its transition's was finished as dead-lettered)."""
        settings = project.commit_status
        assert settings is not None
        if settings.app is not None:
            return self._check_run(transition, project, deadline, claimed)
        report = transition_report(transition, f"{settings.provider}_status")
        if claimed and not self.claim(report):
            return None
        if self.superseded(report, transition, claimed):
            return SUPERSEDED
        assert settings.token_ref is not None  # the model requires a token_ref without an app
        try:
            token = self.secret(settings.token_ref)
        except (
            Exception
        ) as exc:  # a missing or unreadable secret: the report is dead-lettered, the job goes on
            self.give_up(
                report,
                None,
                f"the secret {settings.token_ref} cannot be read ({type(exc).__name__})",
                claimed=claimed,
            )
            return DEAD_LETTERED
        request = status_request(transition, settings, project.repo, token, self.link(transition, project))
        if request is None:
            return None
        return self.reported(report, transition, self.deliver(report, request, deadline, claimed=claimed))

    def _check_run(
        self, transition: JobTransition, project: Project, deadline: float, claimed: bool = True
    ) -> str | None:
        settings = project.commit_status
        assert settings is not None and self.tokens is not None
        report = transition_report(transition, "github_check_run")
        if claimed and not self.claim(report):
            return None
        if self.superseded(report, transition, claimed):
            return SUPERSEDED
        token = self.installation_token(report, settings, deadline, claimed)
        if token is None:
            return DEAD_LETTERED
        table = self.settings.table_name
        run_id = check_run_id(table, transition.job_id)
        summary = self.summary(transition, describe(transition))
        annotations: list[dict[str, Any]] = []
        text = ""
        if transition.status.terminal and transition.failed_tests:
            annotations, text = failure_annotations(self.failures(transition.job_id))
        request = check_run_request(
            transition,
            settings,
            project.repo,
            token,
            self.link(transition, project),
            run_id,
            summary,
            self.clock.now(),
            annotations,
            text,
        )
        result = self.deliver(report, request, deadline, claimed=claimed)
        if result.delivered and run_id is None:
            created = json.loads(result.body or b"{}").get("id")
            if isinstance(created, int):
                run_id = created
                remember_check_run(
                    table,
                    transition.job_id,
                    created,
                    int(self.clock.now()) + self.settings.notice_memory_days * DAY,
                )
        if result.delivered and run_id is not None:
            self._more_annotations(transition, project, token, run_id, summary, annotations, deadline)
        return self.reported(report, transition, result)

    def _more_annotations(
        self,
        transition: JobTransition,
        project: Project,
        token: str,
        run_id: int,
        summary: str,
        annotations: list[dict[str, Any]],
        deadline: float,
    ) -> None:
        """The annotations past the ending request's 50, one update per 50, each a report of its
        own (claimed by its page: a repeat of the record adds none twice)."""
        settings = project.commit_status
        assert settings is not None
        for page, request in enumerate(
            annotation_requests(transition, settings, project.repo, token, run_id, summary, annotations), 1
        ):
            report = transition_report(
                replace(transition, key=f"{transition.key}#annotations#{page}"), "github_check_run"
            )
            if self.claim(report):
                self.deliver(report, request, deadline)

    def installation_token(
        self, report: Report, settings: CommitStatusSettings, deadline: float, claimed: bool = True
    ) -> str | None:
        """The App's installation token; None when there is none (the report is dead-lettered)."""
        assert self.tokens is not None
        try:
            return self.tokens.token(settings, self.policy, deadline)
        except Exception as exc:  # no key, or GitHub refused the App: dead-lettered, the job goes on
            self.give_up(
                report,
                None,
                f"no installation token: {exc if isinstance(exc, TokenUnavailable) else type(exc).__name__}",
                claimed=claimed,
            )
            return None

    def summary(self, transition: JobTransition, heading: str) -> str:
        """The check run's summary: every stage of the job's plan as its records say now."""
        table = self.settings.table_name
        plan = [
            str(stage.get("name"))
            for stage in envelope_of(self.job_record(transition.job_id) or {}).get("stages", [])
        ]
        return stage_summary(
            heading,
            plan,
            stage_records(table, transition.job_id),
            self.clock.now(),
            rejected_at=transition.stage if transition.error_name == REJECTED else None,
        )

    def _stage_change(self, old: dict[str, Any] | None, new: dict[str, Any], deadline: float) -> None:
        """A stage started or ended (the stream's filters pass no lease renewal): a job reporting
        as a GitHub App check run gets its summary updated. Its status and conclusion are the job's
        own reports' to set; a job that ended already told its final summary."""
        status = new.get("status")
        if status == (old or {}).get("status") or not new.get("pk"):
            return
        job_id = str(new["pk"]).removeprefix("STAGES#").removeprefix("JOB#")
        record = self.job_record(job_id)
        transition = job_transition(None, record) if record else None
        if transition is None or transition.status.terminal:
            return
        transition = self.with_stages(transition)
        project = self.project(transition.project)
        settings = project.commit_status if project else None
        if project is None or settings is None or settings.app is None or not transition.commit:
            return
        run_id = check_run_id(self.settings.table_name, job_id)
        if run_id is None:
            return  # the job's first report creates the run, with the summary as it is then
        stage = replace(transition, key=f"stage#{new.get('sk')}#{new.get('attempt')}#{status}")
        report = transition_report(stage, "github_check_run")
        if not self.claim(report):
            return
        token = self.installation_token(report, settings, deadline)
        if token is None:
            return
        request = check_run_output_request(
            stage, settings, project.repo, token, run_id, self.summary(stage, describe(stage))
        )
        self.deliver(report, request, deadline)

    def superseded(self, report: Report, transition: JobTransition, claimed: bool) -> bool:
        """A report older than the newest one its target was told of for the job (a dead-lettered
        one replayed late) is dropped, recorded as superseded: a commit status is one value that
        each report overwrites, and an older state must not be sent over a newer one."""
        latest = latest_reported_at(self.settings.table_name, transition.job_id, report.target)
        if latest is None or transition.at is None or transition.at >= latest:
            return False
        self.drop_superseded(report, "a newer transition of the job was already reported", claimed)
        return True

    def drop_superseded(self, report: Report, reason: str, claimed: bool) -> None:
        self.record(report, Outcome.SUPERSEDED, 1, None, None, reason, self.clock.now())
        if claimed:
            finish_notice(self.settings.table_name, report.subject, report.target, report.key, "superseded")
        logger.info(
            "report superseded",
            extra={"subject": report.subject, "target": report.target, "transition": report.key},
        )

    def reported(self, report: Report, transition: JobTransition, result: SendResult) -> str:
        """A delivered report raises the job's mark for its target: anything older is superseded."""
        if not result.delivered:
            return DEAD_LETTERED
        if transition.at is not None:
            raise_latest_reported(
                self.settings.table_name,
                transition.job_id,
                report.target,
                transition.at,
                ttl=int(self.clock.now()) + self.settings.notice_memory_days * DAY,
            )
        return SENT

    def replay(self, message: dict[str, Any], deadline: float) -> str:
        """A report of StatusDeadLetterQueue (as give_up wrote it) sent again, unless the job has
        moved on since its transition or a newer one was reported (superseded, recorded as such)."""
        transition = transition_from_event(message.get("event") or {})
        if transition is None or message.get("target") not in COMMIT_STATUS_TARGETS:
            return NOT_REPLAYABLE  # a group notification, or a stream batch the event source mapping gave up
        project = self.project(transition.project)
        if (
            project is None
            or project.commit_status is None
            or not wants_report(transition, project.commit_status)
        ):
            return NOT_REPLAYABLE
        record = self.job_record(transition.job_id)
        current = JobStatus(record["status"]) if record else None
        if current is not transition.status:
            report = transition_report(transition, str(message["target"]))
            self.drop_superseded(
                report, f"the job is {current.value if current else 'gone'} now", claimed=False
            )
            return SUPERSEDED
        return self._commit_status(transition, project, deadline, claimed=False) or NOT_REPLAYABLE


def _project_or_none(table: str, project_id: str) -> Project | None:
    try:
        return get_project(table, project_id)
    except RelevoError:
        return None  # deleted since: nothing to report to


def _job_or_none(table: str, job_id: str) -> dict[str, Any] | None:
    try:
        return get_job_record(table, job_id)
    except RelevoError:
        return None  # expired (TTL) or never written


def reporter_from_environment() -> Reporter:
    """The reporter of StatusReporterFunction: its settings, the table's projects and groups,
    secrets through Powertools' cache (SECRET_MAX_AGE_SEC)."""
    settings = notify_settings()
    table = settings.table_name
    return Reporter(
        settings,
        Urllib3Transport(),
        Clock(),
        project=lambda project_id: _project_or_none(table, project_id),
        secret=lambda name: str(parameters.get_secret(name, max_age=settings.secret_max_age_sec)),
        group=lambda name: find_group(table, name),
        projects=lambda: list_projects(table),
        job_record=lambda job_id: _job_or_none(table, job_id),
        failed_tests=lambda job_id, limit: job_failures(table, job_id, limit),
    )
