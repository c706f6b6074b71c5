"""Real GitHub and GitLab payload shapes through the deployed webhook routes."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import requests

from relevo_cli.api import RelevoApi
from relevo_cli.projects import secret_name
from relevo_core.aws import client
from relevo_core.store.jobs import get_envelope
from tests.integration.helpers import deliver

FIXTURES = Path(__file__).resolve().parents[1] / "unit" / "fixtures"


def _fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def _register(stack, project_id: str, repo: str) -> tuple[str, str]:
    github_secret, gitlab_token = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    refs = {}
    for kind, value in (("github", github_secret), ("gitlab", gitlab_token)):
        name = secret_name(stack, project_id, kind)
        client("secretsmanager").create_secret(Name=name, SecretString=value)
        refs[f"{kind}_secret_ref" if kind == "github" else "gitlab_token_ref"] = name
    RelevoApi.for_stack(stack).put_project(
        project_id,
        {"repo": repo, "region_affinity": "us-east", "stages": [{"name": "build", "run": "true"}], "webhook": refs},
    )
    return github_secret, gitlab_token


def test_github_tag_push_and_pull_request_start_jobs_for_the_right_ref(local_stack, project_id):
    github_secret, _ = _register(local_stack, project_id, "Codertocat/Hello-World")

    tag = deliver(local_stack, project_id, _fixture("github_push_tag.json"), github_secret, event="push")
    pr = deliver(local_stack, project_id, _fixture("github_pull_request_opened.json"), github_secret, event="pull_request")
    closed = deliver(local_stack, project_id, _fixture("github_pull_request_closed.json"), github_secret, event="pull_request")
    deleted = deliver(local_stack, project_id, _fixture("github_push_branch_deleted.json"), github_secret, event="push")

    assert tag.status_code == 202 and pr.status_code == 202, (tag.text, pr.text)
    assert get_envelope(local_stack.table_name, tag.json()["job_id"]).ref == "refs/tags/v1.4.0"
    pr_job = get_envelope(local_stack.table_name, pr.json()["job_id"])
    assert pr_job.ref.startswith("refs/pull/") and pr_job.commit == json.loads(_fixture("github_pull_request_opened.json"))["pull_request"]["head"]["sha"]
    assert closed.status_code == 202 and "ignored" in closed.json()
    assert deleted.status_code == 202 and "ignored" in deleted.json()


def test_gitlab_push_hook_is_checked_by_token(local_stack, project_id):
    _, token = _register(local_stack, project_id, "mike/diaspora")
    url = f"{local_stack.api_url}/webhooks/gitlab/{project_id}"
    body = _fixture("gitlab_push_hook.json")

    forged = requests.post(url, data=body, headers={"X-Gitlab-Event": "Push Hook", "X-Gitlab-Token": "guess"}, timeout=60)
    accepted = requests.post(
        url,
        data=body,
        headers={"X-Gitlab-Event": "Push Hook", "X-Gitlab-Token": token, "X-Gitlab-Event-UUID": secrets.token_hex(8)},
        timeout=60,
    )

    assert (forged.status_code, forged.json()["error"]) == (401, "SIGNATURE_INVALID")
    assert accepted.status_code == 202, accepted.text
    envelope = get_envelope(local_stack.table_name, accepted.json()["job_id"])
    assert (envelope.trigger.source, envelope.commit) == ("gitlab", "da1560886d4f094c3e6c9ef40349f7d38b5d27d7")
