"""Real GitHub and GitLab payload shapes through the deployed webhook routes."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import requests
from typer.testing import CliRunner

from relevo_cli.api import RelevoApi
from relevo_cli.commands.common import console
from relevo_cli.main import app
from relevo_cli.projects import secret_name
from relevo_core.aws import client
from relevo_core.store.jobs import get_envelope
from tests.helpers.stack import deliver, job_execution_arn, queue_filled, table_items, wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "fixtures"


def _fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def _register(stack, project_id: str, repo: str, **extra) -> tuple[str, str]:
    github_secret, gitlab_token = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    refs = {}
    for kind, value in (("github", github_secret), ("gitlab", gitlab_token)):
        name = secret_name(stack, project_id, kind)
        client("secretsmanager").create_secret(Name=name, SecretString=value)
        refs[f"{kind}_secret_ref" if kind == "github" else "gitlab_token_ref"] = name
    RelevoApi.for_stack(stack).put_project(
        project_id,
        {
            "repo": repo,
            "region_affinity": "us-east",
            "stages": [{"name": "build", "run": "true"}],
            "webhook": refs,
            **extra,
        },
    )
    return github_secret, gitlab_token


def test_github_tag_push_and_pull_request_start_jobs_for_the_right_ref(local_stack, project_id):
    github_secret, _ = _register(local_stack, project_id, "Codertocat/Hello-World")

    tag = deliver(local_stack, project_id, _fixture("github_push_tag.json"), github_secret, event="push")
    pr = deliver(
        local_stack,
        project_id,
        _fixture("github_pull_request_opened.json"),
        github_secret,
        event="pull_request",
    )
    closed = deliver(
        local_stack,
        project_id,
        _fixture("github_pull_request_closed.json"),
        github_secret,
        event="pull_request",
    )
    deleted = deliver(
        local_stack, project_id, _fixture("github_push_branch_deleted.json"), github_secret, event="push"
    )

    assert tag.status_code == 202 and pr.status_code == 202, (tag.text, pr.text)
    assert get_envelope(local_stack.table_name, tag.json()["job_id"]).ref == "refs/tags/v1.4.0"
    pr_job = get_envelope(local_stack.table_name, pr.json()["job_id"])
    assert (
        pr_job.ref.startswith("refs/pull/")
        and pr_job.commit
        == json.loads(_fixture("github_pull_request_opened.json"))["pull_request"]["head"]["sha"]
    )
    assert closed.status_code == 202 and "ignored" in closed.json()
    assert deleted.status_code == 202 and "ignored" in deleted.json()


def test_gitlab_push_hook_is_checked_by_token(local_stack, project_id):
    _, token = _register(local_stack, project_id, "mike/diaspora")
    url = f"{local_stack.api_url}/webhooks/gitlab/{project_id}"
    body = _fixture("gitlab_push_hook.json")

    forged = requests.post(
        url, data=body, headers={"X-Gitlab-Event": "Push Hook", "X-Gitlab-Token": "guess"}, timeout=60
    )
    accepted = requests.post(
        url,
        data=body,
        headers={
            "X-Gitlab-Event": "Push Hook",
            "X-Gitlab-Token": token,
            "X-Gitlab-Event-UUID": secrets.token_hex(8),
        },
        timeout=60,
    )

    assert (forged.status_code, forged.json()["error"]) == (401, "SIGNATURE_INVALID")
    assert accepted.status_code == 202, accepted.text
    envelope = get_envelope(local_stack.table_name, accepted.json()["job_id"])
    assert (envelope.trigger.source, envelope.commit) == (
        "gitlab",
        "da1560886d4f094c3e6c9ef40349f7d38b5d27d7",
    )


# ------------------------------------------------------------------------------------------------
# Pull requests from forks: refs/pull/N/head holds someone else's commits.

FORK_PR = "github_pull_request_from_fork.json"


def _job_record(stack, job_id: str) -> dict:
    return {item["sk"]["S"]: item for item in table_items(stack, f"JOB#{job_id}")}["JOB"]


def _execution_exists(stack, job_id: str) -> bool:
    try:
        client("stepfunctions").describe_execution(executionArn=job_execution_arn(stack, job_id))
    except client("stepfunctions").exceptions.ExecutionDoesNotExist:
        return False
    return True


def _project_items(stack, project_id: str) -> list[dict]:
    """What intake writes for a project: its jobs, dedup records and deliveries (a scan: tests only)."""
    jobs = [item for item in table_items(stack, "JOB#") if item.get("project", {}).get("S") == project_id]
    return jobs + table_items(stack, f"DEDUP#{project_id}:")


def test_a_fork_pull_request_is_held_until_a_person_releases_it(
    local_stack, intake_settings, project_id, tmp_path, monkeypatch
):
    """Given a project with the default fork_pull_requests (hold), when a signed pull_request from a
    fork arrives, then its job is written held with the reason, takes no queue slot (it is accepted
    while the queue is full) and starts no execution; a redelivery of the same commit is a
    duplicate; `release` starts it."""
    github_secret, _ = _register(local_stack, project_id, "Codertocat/Hello-World")

    with queue_filled(local_stack, intake_settings.queue_limit):
        held = deliver(local_stack, project_id, _fixture(FORK_PR), github_secret, event="pull_request")

    assert held.status_code == 202, held.text
    job_id = held.json()["job_id"]
    assert held.json() == {"job_id": job_id, "duplicate": False, "outcome": "held"}
    record = _job_record(local_stack, job_id)
    assert (record["status"]["S"], record["held_reason"]["S"]) == ("held", "fork_pull_request")
    assert "start_pending" not in record  # the sweep that starts forgotten jobs does not see it
    assert not _execution_exists(local_stack, job_id)
    api = RelevoApi.for_stack(local_stack)
    view = api.get_job(job_id)
    assert (view["status"], view["held_reason"], view["ref"]) == (
        "held",
        "fork_pull_request",
        "refs/pull/2/head",
    )
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(local_stack.model_dump()))
    # The CLI's console took its width when it was created; wide enough that no cell wraps.
    monkeypatch.setattr(console, "width", 300)
    shown = CliRunner().invoke(app, ["job", "show", job_id, "--stack-file", str(stack_file)])
    assert (
        shown.exit_code == 0
        and f"held (fork_pull_request): `relevo job release {job_id}` starts it" in shown.output
    ), shown.output
    held_jobs = api.list_jobs(project=project_id, status="held")["jobs"]
    assert [(job["job_id"], job["held_reason"]) for job in held_jobs] == [(job_id, "fork_pull_request")]
    listed = CliRunner().invoke(
        app, ["jobs", "--project", project_id, "--status", "held", "--stack-file", str(stack_file)]
    )
    assert listed.exit_code == 0 and "held (fork_pull_request)" in listed.output, listed.output

    again = deliver(local_stack, project_id, _fixture(FORK_PR), github_secret, event="pull_request")

    assert again.status_code == 200, again.text
    assert again.json() == {"job_id": job_id, "duplicate": True}
    assert not _execution_exists(local_stack, job_id)

    released = api.release_job(job_id)

    assert released["job_id"] == job_id
    assert wait_until(lambda: _execution_exists(local_stack, job_id), 10, "execution of the released job")
    record = _job_record(local_stack, job_id)
    assert record["status"]["S"] != "held" and "held_reason" not in record
    assert api.get_job(job_id)["held_reason"] is None


def test_a_canceled_held_fork_pull_request_no_longer_says_it_is_held(local_stack, project_id):
    """Given a fork pull request's held job, when an operator cancels it instead of releasing it,
    then the job ends canceled without an execution and its record and view drop the held reason
    (the CLI would otherwise still say `relevo release` starts it)."""
    github_secret, _ = _register(local_stack, project_id, "Codertocat/Hello-World")
    job_id = deliver(local_stack, project_id, _fixture(FORK_PR), github_secret, event="pull_request").json()[
        "job_id"
    ]
    api = RelevoApi.for_stack(local_stack)

    canceled = api.cancel_job(job_id)

    assert (canceled["status"], canceled["was"]) == ("canceled", "held")
    record = _job_record(local_stack, job_id)
    assert record["status"]["S"] == "canceled" and "held_reason" not in record
    assert api.get_job(job_id)["held_reason"] is None
    assert not _execution_exists(local_stack, job_id)


def test_a_fork_pull_request_is_ignored_when_the_project_says_so(local_stack, project_id):
    """Given fork_pull_requests: ignore, when a fork's pull request arrives, then it is answered
    202 ignored with the pull request and the fork named, and nothing is written."""
    github_secret, _ = _register(
        local_stack, project_id, "Codertocat/Hello-World", fork_pull_requests="ignore"
    )
    before = _project_items(local_stack, project_id)

    response = deliver(local_stack, project_id, _fixture(FORK_PR), github_secret, event="pull_request")

    assert response.status_code == 202, response.text
    assert response.json() == {
        "ignored": "pull request #2 comes from fork octo-fork/Hello-World; the project's fork_pull_requests "
        "is ignore"
    }
    assert _project_items(local_stack, project_id) == before == []


def test_a_fork_pull_request_runs_when_the_project_trusts_its_forks(local_stack, project_id):
    """Given fork_pull_requests: run, when a fork's pull request arrives, then its job is queued and
    its execution started like any other trigger's."""
    github_secret, _ = _register(local_stack, project_id, "Codertocat/Hello-World", fork_pull_requests="run")

    response = deliver(local_stack, project_id, _fixture(FORK_PR), github_secret, event="pull_request")

    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    assert response.json() == {"job_id": job_id, "duplicate": False}
    record = _job_record(local_stack, job_id)
    assert record["status"]["S"] in ("queued", "running") and "held_reason" not in record
    assert _execution_exists(local_stack, job_id)


@pytest.mark.parametrize("policy", ["ignore", "hold"])
def test_a_pull_request_from_the_repository_itself_is_not_held(local_stack, project_id, policy):
    """Given any fork policy, when a pull request from a branch of the project's own repository
    arrives, then it starts a job at once: the policy is for forks only."""
    github_secret, _ = _register(local_stack, project_id, "Codertocat/Hello-World", fork_pull_requests=policy)

    response = deliver(
        local_stack,
        project_id,
        _fixture("github_pull_request_opened.json"),
        github_secret,
        event="pull_request",
    )

    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    assert response.json() == {"job_id": job_id, "duplicate": False}
    assert _execution_exists(local_stack, job_id)
