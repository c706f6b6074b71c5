"""The GitHub webhook route on the embedded stack: API adapter -> function process -> DynamoDB
and Step Functions. Each refusal carries its code and writes nothing."""

from __future__ import annotations

import json
import secrets

import pytest
import requests

from relevo_core.intake.webhooks.github import sign
from relevo_core.store.codec import envelope_of, from_attributes
from tests.helpers.payloads import push_body
from tests.helpers.stack import deliver, job_execution_arn, register_project, table_items

STAGES = [{"name": "build", "run": "true"}]


def _jobs_of(stack, project_id):
    return [
        item
        for item in table_items(stack, "JOB#")
        if item.get("project", {}).get("S") == project_id and item["sk"]["S"] == "JOB"
    ]


def test_signed_push_creates_one_job_and_starts_its_execution(local_stack, project_id):
    """Given a registered project, when a correctly signed push arrives, then one job is written
    with the frozen plan and an execution named by its job id is started."""
    secret = register_project(local_stack, project_id, STAGES)
    commit = secrets.token_hex(20)

    response = deliver(local_stack, project_id, push_body(f"acme/{project_id}", commit), secret)

    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    jobs = _jobs_of(local_stack, project_id)
    assert [job["job_id"]["S"] for job in jobs] == [job_id]
    envelope = envelope_of(from_attributes(jobs[0]))  # packed on the record (store/codec)
    assert envelope["commit"] == commit
    assert envelope["region_affinity"] == "eu-west"
    assert envelope["stages"][0]["command"] == "true"
    from relevo_core.aws import client

    arn = job_execution_arn(local_stack, job_id)
    assert client("stepfunctions").describe_execution(executionArn=arn)["name"] == job_id


def test_redelivery_is_answered_as_duplicate_and_writes_nothing(local_stack, project_id):
    """Given a push already accepted, when GitHub delivers it again, then the answer names the
    existing job and no second job or execution exists."""
    secret = register_project(local_stack, project_id, STAGES)
    body = push_body(f"acme/{project_id}", secrets.token_hex(20))
    first = deliver(local_stack, project_id, body, secret)

    again = deliver(local_stack, project_id, body, secret)

    assert again.status_code == 200
    assert again.json() == {"job_id": first.json()["job_id"], "duplicate": True}
    assert len(_jobs_of(local_stack, project_id)) == 1


@pytest.mark.parametrize(
    "mutate, status, code",
    [
        (
            lambda body, secret: {"X-Hub-Signature-256": sign("not-the-secret", body)},
            401,
            "SIGNATURE_INVALID",
        ),
        (lambda body, secret: {"X-Hub-Signature-256": ""}, 401, "SIGNATURE_INVALID"),
    ],
)
def test_bad_signature_is_refused_and_writes_nothing(local_stack, project_id, mutate, status, code):
    secret = register_project(local_stack, project_id, STAGES)
    body = push_body(f"acme/{project_id}", secrets.token_hex(20))

    response = deliver(local_stack, project_id, body, secret, **mutate(body, secret))

    assert (response.status_code, response.json()["error"]) == (status, code)
    assert _jobs_of(local_stack, project_id) == []
    assert table_items(local_stack, "DEDUP#" + project_id) == []


def test_malformed_json_with_valid_signature_is_400(local_stack, project_id):
    secret = register_project(local_stack, project_id, STAGES)

    response = deliver(local_stack, project_id, b"{not json", secret)

    assert (response.status_code, response.json()["error"]) == (400, "MALFORMED_JSON")
    assert _jobs_of(local_stack, project_id) == []


def test_body_over_one_mebibyte_is_413(local_stack, project_id):
    secret = register_project(local_stack, project_id, STAGES)
    body = b'{"padding": "' + b"x" * (1024 * 1024) + b'"}'

    response = deliver(local_stack, project_id, body, secret)

    assert (response.status_code, response.json()["error"]) == (413, "PAYLOAD_TOO_LARGE")


def test_unknown_project_is_404(local_stack):
    body = push_body("acme/nobody", secrets.token_hex(20))
    response = deliver(local_stack, "no-such-project", body, "whatever")
    assert (response.status_code, response.json()["error"]) == (404, "PROJECT_NOT_FOUND")


def test_ping_branch_deletion_and_other_repos_start_nothing(local_stack, project_id):
    secret = register_project(local_stack, project_id, STAGES)
    repo = f"acme/{project_id}"

    ping = deliver(
        local_stack,
        project_id,
        json.dumps({"zen": "Keep it logically awesome."}).encode(),
        secret,
        event="ping",
    )
    deletion = deliver(local_stack, project_id, push_body(repo, "", deleted=True), secret)
    other = deliver(local_stack, project_id, push_body("acme/other", secrets.token_hex(20)), secret)

    assert ping.status_code == 200
    assert deletion.status_code == 202 and "ignored" in deletion.json()
    assert other.status_code == 202 and "ignored" in other.json()
    assert _jobs_of(local_stack, project_id) == []


def test_iam_routes_refuse_unsigned_requests(local_stack, project_id):
    """Every route but the webhooks is IAM-authenticated: an unsigned call never reaches a function."""
    response = requests.get(f"{local_stack.api_url}/jobs/job_{'0' * 26}", timeout=10)
    assert response.status_code == 403
    # API Gateway's own refusal, in Relevo's error shape (template GatewayResponses).
    assert response.json()["error"] == "UNAUTHENTICATED"
    assert response.headers["x-amzn-ErrorType"] == "GatewayError"


def test_project_without_region_affinity_is_rejected_naming_the_field(local_stack, project_id):
    from relevo_cli.api import ApiError, RelevoApi

    with pytest.raises(ApiError) as refused:
        RelevoApi.for_stack(local_stack).put_project(project_id, {"repo": "acme/x", "stages": STAGES})

    assert refused.value.status == 422
    assert refused.value.code == "VALIDATION_FAILED"
    assert "region_affinity" in refused.value.body["message"]
