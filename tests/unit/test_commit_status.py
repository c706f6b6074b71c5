"""Job transitions read off the job record's stream images, and the commit status each one
becomes: GitHub's calls checked against GitHub's published REST description, GitLab's against its
documented parameters."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

import pytest

from relevo_core.models.project_settings import CommitStatusSettings
from relevo_core.models.status import JobStatus
from relevo_core.notify.commit_status import status_request
from relevo_core.notify.transitions import job_link, job_transition
from relevo_local.github.openapi import check_call

MACHINE = "arn:aws:states:eu-west-1:123456789012:stateMachine:relevo-jobs"
QUEUED_MACHINE = "arn:aws:states:eu-west-1:123456789012:stateMachine:relevo-jobs-queued"
MACHINES = (MACHINE, QUEUED_MACHINE)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
GITHUB = CommitStatusSettings(provider="github", token_ref="relevo/s/_status/app")
GITLAB = CommitStatusSettings(
    provider="gitlab", token_ref="relevo/s/_status/app", api_url="https://gitlab.example.com/api/v4"
)

# GitLab, "Set the pipeline status of a commit"
# (docs.gitlab.com/api/commits/#set-the-pipeline-status-of-a-commit):
# POST /projects/:id/statuses/:sha; id and sha and state required; state one of these; the others optional
# strings.
GITLAB_STATES = {"pending", "running", "success", "failed", "canceled", "skipped"}
GITLAB_PARAMETERS = {
    "state",
    "ref",
    "name",
    "context",
    "target_url",
    "description",
    "coverage",
    "pipeline_id",
}


def _job(status: str, **extra):
    return {
        "pk": "JOB#job_x",
        "sk": "JOB",
        "job_id": "job_0000000000000000000000a",
        "project": "ios-app",
        "status": status,
        "updated_at": extra.pop("updated_at", "2026-12-01T10:00:00+00:00"),
        "envelope": {
            "ref": "refs/heads/main",
            "commit": COMMIT,
            "trigger": {"type": "webhook", "source": "github", "actor": "ana"},
        },
        **extra,
    }


def _transition(old_status, new_status, **extra):
    return job_transition(_job(old_status) if old_status else None, _job(new_status, **extra))


LIFE = [
    (None, "queued", {}),
    ("queued", "running", {}),
    ("running", "waiting", {"waiting_stage": "deploy"}),
    ("waiting", "running", {"updated_at": "2026-12-01T10:05:00+00:00"}),
    ("running", "succeeded", {}),
    ("running", "failed", {"error_name": "Relevo.Fatal.ExitCode"}),
    ("running", "failed", {"error_name": "Relevo.Timeout.Queue"}),
    ("waiting", "failed", {"error_name": "Relevo.Approval.Rejected", "waiting_stage": "deploy"}),
    ("running", "canceled", {}),
]


def test_each_status_change_is_one_transition_and_anything_else_none():
    assert _transition("running", "running") is None
    assert job_transition(None, {"pk": "STAGES#j", "sk": "STAGE#00", "status": "running"}) is None
    keys = [_transition(old, new, **extra).key for old, new, extra in LIFE[:5]]
    assert keys == [
        "queued#2026-12-01T10:00:00+00:00",
        "running#2026-12-01T10:00:00+00:00",
        "waiting#deploy",
        "running#2026-12-01T10:05:00+00:00",
        "ended",
    ]


@pytest.mark.parametrize("old,new,extra", LIFE)
def test_every_github_call_is_an_operation_of_github_s_description(old, new, extra):
    request = status_request(
        _transition(old, new, **extra), GITHUB, "acme/ios-app", "tok", "https://console/jobs/j"
    )
    url = urlsplit(request.url)
    assert (url.scheme, url.netloc) == ("https", "api.github.com")
    assert check_call(request.method, url.path, request.body) == "repos/create-commit-status"
    assert request.body["context"] == "relevo/ios-app"
    assert request.headers["Authorization"] == "Bearer tok"


def test_the_github_states_follow_the_job():
    states = [
        status_request(_transition(o, n, **e), GITHUB, "acme/ios-app", "t", "l").body["state"]
        for o, n, e in LIFE
    ]
    assert states == [
        "pending",
        "pending",
        "pending",
        "pending",
        "success",
        "failure",
        "error",
        "failure",
        "error",
    ]
    waiting = status_request(_transition(*LIFE[2][:2], **LIFE[2][2]), GITHUB, "acme/ios-app", "t", "l").body
    assert (
        waiting["description"]
        == "waiting for approval of deploy: relevo job approve job_0000000000000000000000a"
    )


def test_the_check_names_what_github_would_refuse():
    with pytest.raises(AssertionError, match="'waiting' is not one of"):
        check_call("POST", "/repos/acme/app/statuses/abc", {"state": "waiting", "context": "relevo/app"})
    with pytest.raises(AssertionError, match="'state' is a required property"):
        check_call("POST", "/repos/acme/app/statuses/abc", {"context": "relevo/app"})
    with pytest.raises(AssertionError, match="no operation"):
        check_call("PUT", "/repos/acme/app/statuses/abc", {"state": "success"})


def test_gitlab_calls_use_its_documented_parameters_and_never_step_back_to_pending():
    sent = []
    for old, new, extra in LIFE:
        request = status_request(_transition(old, new, **extra), GITLAB, "group/sub/ios-app", "glpat", "l")
        if request is None:
            sent.append(None)
            continue
        url = urlsplit(request.url)
        assert url.netloc == "gitlab.example.com" and request.method == "POST"
        prefix, project, statuses, sha = url.path.rsplit("/", 3)
        assert (prefix, unquote(project), statuses, sha) == (
            "/api/v4/projects",
            "group/sub/ios-app",
            "statuses",
            COMMIT,
        )
        assert set(request.body) <= GITLAB_PARAMETERS and request.body["state"] in GITLAB_STATES
        assert request.body["ref"] == "main" and request.headers == {"PRIVATE-TOKEN": "glpat"}
        sent.append(request.body["state"])
    # GitLab refuses running → running and running → pending: the gate and the run after it send nothing.
    assert sent == ["pending", "running", None, None, "success", "failed", "failed", "failed", "canceled"]


def test_a_job_without_a_commit_reports_nothing():
    job = _job("running")
    job["envelope"]["commit"] = None
    assert status_request(job_transition(_job("queued"), job), GITHUB, "acme/ios-app", "t", "l") is None


def test_the_link_is_the_execution_or_the_project_s_console():
    transition = _transition("queued", "running")
    assert (
        job_link(transition, MACHINES, "https://relevo.example.com/")
        == "https://relevo.example.com/jobs/job_0000000000000000000000a"
    )
    # A job that queued for its project runs the queued machine.
    assert job_link(transition, MACHINES, None) == (
        "https://eu-west-1.console.aws.amazon.com/states/home?region=eu-west-1#/v2/executions/details/"
        "arn:aws:states:eu-west-1:123456789012:execution:relevo-jobs-queued:job_0000000000000000000000a"
    )
    assert transition.status is JobStatus.RUNNING
    # One whose intake took the lock (its record says so) runs the common machine.
    took_lock = _transition(None, "running", machine="run")
    assert job_link(took_lock, MACHINES, None) == (
        "https://eu-west-1.console.aws.amazon.com/states/home?region=eu-west-1#/v2/executions/details/"
        "arn:aws:states:eu-west-1:123456789012:execution:relevo-jobs:job_0000000000000000000000a"
    )


def test_a_success_with_warning_stages_is_a_success_whose_description_names_them():
    # Given the job record the state machine wrote at the success: each stage's answer, lint's a warning
    outcomes = (
        '[{"stage":"build","attempt":1,"agent_id":"mac-1","status":"succeeded"},'
        '{"stage":"lint","attempt":1,"agent_id":"mac-1","status":"warning"},{"agent_id":"mac-2","attempt":2}]'
    )
    transition = _transition("running", "succeeded", stage_outcomes=outcomes)

    github = status_request(transition, GITHUB, "acme/ios-app", "tok", "https://console/jobs/j").body
    gitlab = status_request(transition, GITLAB, "group/ios-app", "glpat", "https://console/jobs/j").body

    assert transition.warning_stages == ("lint",)
    assert (github["state"], github["description"]) == ("success", "succeeded, with warnings in lint")
    assert (
        check_call("POST", "/repos/acme/ios-app/statuses/" + COMMIT, github) == "repos/create-commit-status"
    )
    assert (gitlab["state"], gitlab["description"]) == ("success", "succeeded, with warnings in lint")
    # Without warnings, the same success as before
    assert (
        status_request(_transition("running", "succeeded"), GITHUB, "acme/ios-app", "t", "l").body[
            "description"
        ]
        == "succeeded"
    )
