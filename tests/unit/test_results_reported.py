"""A job's tests where people look outside Relevo (docs/test-results.md, "Where results show"):
its commit status says the counts and names the failures where they fit (GitLab's has no
annotations), its GitHub App check run annotates each failure at its file and line, 50 a request
(every request checked against GitHub's REST description), and a Slack message carries the counts."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlsplit

from relevo_core.config.notify import NotifySettings
from relevo_core.jobs.results_listing import job_tests
from relevo_core.models.project import Project
from relevo_core.models.project_settings import CommitStatusSettings
from relevo_core.models.requests import JobTestsQuery
from relevo_core.notify import reporter as reporter_module
from relevo_core.notify.commit_status import DESCRIPTION_LIMIT, describe, status_request
from relevo_core.notify.github_app import annotation_requests, check_run_request, failure_annotations
from relevo_core.notify.groups import job_notices
from relevo_core.notify.messages import slack_message
from relevo_core.notify.reporter import Reporter
from relevo_core.notify.sending import SendResult
from relevo_core.notify.transitions import job_transition, transition_from_event, with_stage_records
from relevo_local.github.openapi import check_call
from tests.helpers.block_kit import check_message
from tests.unit.test_commit_status import COMMIT, GITHUB, GITLAB, _job
from tests.unit.test_job_tests_listing import Bucket
from tests.unit.test_job_tests_listing import _job as job_with_results

APP = CommitStatusSettings(
    provider="github",
    api_url="https://api.github.com",
    app={"app_id": 1234, "installation_id": 99, "private_key_ref": "relevo/s/_status/app-key"},
)


def _ended(**extra):
    """The job's end with its stage and shard records as the reporter reads them (the results
    stored as the agent stores them: relevo_tools.results_as_agent)."""
    bucket = Bucket()
    items = job_with_results(bucket)
    records = [item for item in items if item["sk"] != "JOB"]
    transition = job_transition(_job("running"), _job("failed", error_name="Relevo.Fatal.ExitCode", **extra))
    stages = [record for record in records if "#SHARD#" not in record["sk"]]
    shards = [record for record in records if "#SHARD#" in record["sk"]]
    return with_stage_records(transition, stages, shards), items, bucket


def test_the_end_of_a_job_counts_its_tests_across_stages_and_shards_from_their_records():
    # Given a job whose build stage and two shards stored results; when it ends
    transition, _items, _bucket = _ended()
    # Then its tests are counted from the records' summaries (each shard's last attempt)
    assert transition.tests == (5, 1, 1, 1, 7)
    # And a dead-lettered report replays with the same counts and names
    named = replace(transition, failed_tests=("t.Math::adds",))
    again = transition_from_event(named.as_event())
    assert again is not None and (again.tests, again.failed_tests) == ((5, 1, 1, 1, 7), ("t.Math::adds",))


def test_the_commit_status_says_the_counts_and_the_failures_names_where_they_fit():
    transition, _items, _bucket = _ended()
    named = replace(transition, failed_tests=("t.Math::adds", "t.Net::slow"))

    # GitHub's status, checked against its REST description
    github = status_request(named, GITHUB, "acme/ios-app", "ghp", "https://x/jobs/j")
    assert github is not None
    assert check_call(github.method, urlsplit(github.url).path, github.body) == "repos/create-commit-status"
    assert github.body["description"] == (
        "failed: Relevo.Fatal.ExitCode; tests: 5 passed (1 flaky), 1 failed, 1 skipped; "
        "failed: t.Math::adds, t.Net::slow"
    )
    # GitLab's status has no annotations: the same description carries them
    gitlab = status_request(named, GITLAB, "group/ios-app", "glpat", "l")
    assert gitlab is not None and gitlab.body["description"] == github.body["description"]

    # Names that do not all fit: as many as fit, then "…", never past GitHub's 140 characters
    long = replace(
        transition, failed_tests=tuple(f"tests.module_{n}.TestLongName::test_case_{n}" for n in range(9))
    )
    text = describe(long)
    assert len(text) <= DESCRIPTION_LIMIT and text.endswith(", …")
    assert "; failed: tests.module_0.TestLongName::test_case_0" in text
    # A name that cannot fit at all is left out: the counts are still said
    huge = replace(transition, failed_tests=("x" * 200,))
    assert describe(huge).endswith("tests: 5 passed (1 flaky), 1 failed, 1 skipped")


def test_a_job_without_test_reports_says_nothing_of_tests():
    transition = job_transition(_job("running"), _job("succeeded"))
    ended = with_stage_records(
        transition, [{"sk": "STAGE#00", "stage_name": "build", "status": "succeeded"}], []
    )
    assert ended.tests is None and "tests" not in describe(ended)


def test_the_check_run_annotates_each_failure_at_its_file_and_line_50_a_request():
    # Given the job's failures as GET /jobs/{id}/tests lists them
    transition, items, bucket = _ended()
    failures = job_tests(items, bucket.read, JobTestsQuery(status="failed"))["tests"]
    annotations, text = failure_annotations(failures)
    # Then the failure with a file is annotated there, with its message and where it ran
    assert annotations == [
        {
            "path": "tests/t_math.py",
            "start_line": 12,
            "end_line": 12,
            "annotation_level": "failure",
            "title": "t.Math::adds",
            "message": "assert 2 == 3",
            "raw_details": "t.Math::adds (failed, test[0] on mac-2)",
        }
    ]
    assert text == ""
    ending = check_run_request(
        transition, APP, "acme/ios-app", "ghs", "https://x/jobs/j", 77, "s", 0.0, annotations
    )
    assert check_call(ending.method, urlsplit(ending.url).path, ending.body) == "checks/update"
    assert ending.body["output"]["annotations"] == annotations and ending.body["conclusion"] == "failure"

    # Given 120 failures with a file and 2 without
    many = [
        {**failures[0], "id": f"t.Math::case_{n}", "line": n + 1 if n % 2 else None} for n in range(120)
    ] + [
        {**failures[0], "id": f"t.Ui::lost_{n}", "file": None, "message": "crashed\nstack"} for n in range(2)
    ]
    annotations, text = failure_annotations(many)
    # When the run is created with the first 50, then updated with the rest
    created = check_run_request(
        transition, APP, "acme/ios-app", "ghs", "https://x/jobs/j", None, "s", 0.0, annotations, text
    )
    more = annotation_requests(transition, APP, "acme/ios-app", "ghs", 77, "s", annotations)
    # Then each request holds at most 50, every annotation is sent once, each call is GitHub's
    assert check_call(created.method, urlsplit(created.url).path, created.body) == "checks/create"
    for update in more:
        assert check_call(update.method, urlsplit(update.url).path, update.body) == "checks/update"
        assert set(update.body) == {"output"}  # an update of annotations never touches the conclusion
    pages = [
        created.body["output"]["annotations"],
        *(update.body["output"]["annotations"] for update in more),
    ]
    assert [len(page) for page in pages] == [50, 50, 20]
    assert [a["title"] for page in pages for a in page] == [f"t.Math::case_{n}" for n in range(120)]
    # A failure without a line is annotated at line 1; those without a file are in the text
    assert pages[0][0]["start_line"] == 1 and pages[0][1]["start_line"] == 2
    assert "`t.Ui::lost_0 (failed, test[0] on mac-2)`: crashed" in created.body["output"]["text"]


def test_the_slack_message_carries_the_counts():
    transition, _items, _bucket = _ended()
    ((notice, _key),) = job_notices(transition, "https://x/jobs/j")
    assert ("Tests", "5 passed (1 flaky), 1 failed, 1 skipped") in notice.facts()
    message = slack_message(notice)
    assert check_message(message) == []
    fields = [field["text"] for block in message["blocks"] for field in block.get("fields", [])]
    assert "*Tests*\n5 passed (1 flaky), 1 failed, 1 skipped" in fields
    assert COMMIT[:12] in " ".join(fields)


class _FixedClock:
    def now(self) -> float:
        return 1_796_000_000.0


class _Reporter(Reporter):
    """The status reporter with the table and GitHub left out: every claim granted once, every
    request recorded and answered as GitHub answers a created run (its id)."""

    def claim(self, report) -> bool:
        self.claimed = [*getattr(self, "claimed", []), report.key]
        return report.key not in self.claimed[:-1]

    def deliver(self, report, request, deadline, claimed=True) -> SendResult:
        self.sent = [*getattr(self, "sent", []), request]
        return SendResult(attempts=(), delivered=True, reason=None, body=b'{"id": 77}')

    def superseded(self, report, transition, claimed) -> bool:
        return False

    def installation_token(self, report, settings, deadline, claimed=True) -> str:
        return "ghs"

    def summary(self, transition, heading) -> str:
        return heading

    def reported(self, report, transition, result) -> str:
        return "sent"


def test_the_reporter_reads_the_failures_once_and_sends_the_ending_then_one_update_per_50(monkeypatch):
    # Given a job of a GitHub App project that ends with 120 failures with a file, its records
    # counting them, and no check run yet
    _transition, items, bucket = _ended()
    failures = job_tests(items, bucket.read, JobTestsQuery(status="failed"))["tests"]
    many = [{**failures[0], "id": f"t.Math::case_{n}"} for n in range(120)]
    records = [item for item in items if item["sk"] != "JOB"]
    monkeypatch.setattr(
        reporter_module,
        "stage_and_shard_records",
        lambda _table, _job: (
            [r for r in records if "#SHARD#" not in r["sk"]],
            [r for r in records if "#SHARD#" in r["sk"]],
        ),
    )
    monkeypatch.setattr(reporter_module, "check_run_id", lambda _table, _job: None)
    monkeypatch.setattr(reporter_module, "remember_check_run", lambda *_args: None)
    reads: list[str] = []
    project = Project.model_validate(
        {
            "id": "ios-app",
            "repo": "acme/ios-app",
            "region_affinity": "eu",
            "stages": [{"name": "build", "run": "make"}],
            "commit_status": APP.model_dump(mode="json", exclude_none=True),
        }
    )
    settings = NotifySettings.model_validate(
        {
            "TABLE_NAME": "relevo",
            "GROUP_TOPIC_ARN": "arn:aws:sns:eu-west-1:1:t",
            "STATUS_DEAD_LETTER_QUEUE_URL": "https://sqs/q",
            "STATE_MACHINE_ARN": "arn:aws:states:eu-west-1:1:x",
            "QUEUED_STATE_MACHINE_ARN": "arn:aws:states:eu-west-1:1:y",
        }
    )
    reporter = _Reporter(
        settings,
        None,
        _FixedClock(),
        project=lambda _id: project,
        secret=lambda _name: "",
        failed_tests=lambda job_id, limit: reads.append(job_id) or many[:limit],
    )

    # When the job's end is reported
    reporter.report_change(_job("running"), _job("failed", error_name="Relevo.Fatal.ExitCode"), 0.0)

    # Then the failures were read once, the run created with the first 50, then updated twice
    assert len(reads) == 1
    assert [(r.method, len(r.body["output"].get("annotations", []))) for r in reporter.sent] == [
        ("POST", 50),
        ("PATCH", 50),
        ("PATCH", 20),
    ]
    assert reporter.sent[1].url.endswith("/check-runs/77")
    for request in reporter.sent:
        check_call(request.method, urlsplit(request.url).path, request.body)
    # And the run's title names the first failures
    assert "failed: t.Math::case_0, t.Math::case_1" in reporter.sent[0].body["output"]["title"]

    # When the same change comes again (the stream's redelivery): no page is sent twice
    reporter.report_change(_job("running"), _job("failed", error_name="Relevo.Fatal.ExitCode"), 0.0)
    assert len(reporter.sent) == 3
