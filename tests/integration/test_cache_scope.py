"""A project's caches as an attacker would try them, with the job credentials an agent really
holds (a JobRole session minted by the claim route, on the local stack with IAM enforcement on):
a pull request from a fork reads its project's caches and writes nothing of them (no entry, no
blob, no record: AccessDenied), a default-branch job of the same project writes them, and no
job reads or writes another project's caches. Each refusal is asserted by the error AWS gives."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from botocore.credentials import ReadOnlyCredentials

from relevo_agent.claim import new_claim_secret
from relevo_agent.claim_routes import ClaimRoutes
from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_core.models.agent_session import ClaimRequest, JobSession
from relevo_core.models.cache import cache_prefix
from tests.helpers.iam import client_as, refusal_code
from tests.helpers.payloads import push_body
from tests.helpers.stack import deliver, receive_stage, register_project

FORK_PR = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "github_pull_request_from_fork.json"
CACHES = [{"name": "deps", "paths": [".deps"], "key": "deps-{hash:deps.lock}"}]
STAGES = [{"name": "build", "run": "true", "cache": ["deps"]}]


def _session(stack, job_id: str) -> JobSession:
    found = stack.agent_credentials["eu-west"]
    routes = ClaimRoutes(
        stack.api_url,
        "eu-west",
        stack.region,
        credentials=lambda: ReadOnlyCredentials(
            found.access_key_id, found.secret_access_key, found.session_token
        ),
    )
    task = receive_stage(stack, job_id, timeout=60)[0]
    return routes.claim(
        ClaimRequest(
            job_id=job_id,
            stage_index=task["stage_index"],
            attempt=task["attempt"],
            agent_id=f"mac-{secrets.token_hex(3)}",
            claim_secret=new_claim_secret(),
            dispatch_key=task["dispatch_key"],
            dispatch_token=task["task_token"],
            accept=False,
        )
    ).session


def _as(stack, session: JobSession, service: str):
    return client_as(stack, service, session.access_key_id, session.secret_access_key, session.session_token)


@pytest.fixture(scope="module")
def jobs(local_stack):
    """A fork's pull request and a push to main of project P (which runs forks' pull requests,
    and has a cache), and a push to main of project Q."""
    stack, suffix = local_stack, secrets.token_hex(3)
    p, q = f"p-cache-{suffix}", f"q-cache-{suffix}"
    p_secret = register_project(
        stack, p, STAGES, repo="Codertocat/Hello-World", caches=CACHES, fork_pull_requests="run"
    )
    q_secret = register_project(stack, q, STAGES, caches=CACHES)
    fork = deliver(stack, p, FORK_PR.read_bytes(), p_secret, event="pull_request")
    assert fork.status_code == 202 and fork.json().get("outcome") != "held", fork.text
    fork_session = _session(stack, fork.json()["job_id"])
    # P runs one job at a time: the fork's is canceled (its session stays valid) so that main's runs.
    RelevoApi.for_stack(stack).cancel_job(fork.json()["job_id"])
    main = deliver(stack, p, push_body("Codertocat/Hello-World", secrets.token_hex(20)), p_secret)
    main_session = _session(stack, main.json()["job_id"])
    # Q's push only once main's stage is claimed: receive_stage discards the messages of other
    # jobs, so Q's stage message, dispatched first on a loaded host, was deleted while main's was
    # awaited (CI: "no stage message for <Q's job> within 60s").
    other = deliver(stack, q, push_body(f"acme/{q}", secrets.token_hex(20)), q_secret)
    return {
        "p": p,
        "q": q,
        "fork": fork_session,
        "main": main_session,
        "q_main": _session(stack, other.json()["job_id"]),
    }


def test_a_forks_pull_request_reads_its_projects_cache_and_writes_nothing_of_it(local_stack, jobs):
    # Given P's cache holds an entry (put by the stack's own credentials)
    bucket, prefix = local_stack.resources["ArtifactBucket"], cache_prefix(jobs["p"], "eu-west")
    entry, blob = f"{prefix}entries/{'e' * 64}.json", f"{prefix}blobs/{'b' * 64}"
    client("s3").put_object(Bucket=bucket, Key=entry, Body=b"{}")
    s3, dynamodb = _as(local_stack, jobs["fork"], "s3"), _as(local_stack, jobs["fork"], "dynamodb")

    # Then the fork's job reads it, and queries P's cache records
    assert s3.get_object(Bucket=bucket, Key=entry)["Body"].read() == b"{}"
    pk = {"pk": {"S": f"CACHE#{jobs['p']}/eu-west"}, "sk": {"S": "KEY#deps/x"}}
    dynamodb.get_item(TableName=local_stack.table_name, Key=pk)
    # but its PutObject of an entry (over the one there, or a new one) or of a blob is refused
    for key in (entry, f"{prefix}entries/{'f' * 64}.json", blob):
        assert refusal_code(lambda key=key: s3.put_object(Bucket=bucket, Key=key, Body=b"poison")) == (
            "AccessDenied"
        ), key
    assert refusal_code(lambda: s3.create_multipart_upload(Bucket=bucket, Key=blob)) == "AccessDenied"
    # and so is a record of an entry, or a change to what a record says
    item = {**pk, "manifest_sha256": {"S": "0" * 64}}
    assert (
        refusal_code(lambda: dynamodb.put_item(TableName=local_stack.table_name, Item=item))
        == "AccessDeniedException"
    )
    forge = {
        "TableName": local_stack.table_name,
        "Key": pk,
        "UpdateExpression": "SET manifest_sha256 = :v",
        "ExpressionAttributeValues": {":v": {"S": "0" * 64}},
    }
    assert refusal_code(lambda: dynamodb.update_item(**forge)) == "AccessDeniedException"
    # and the entry is as it was
    assert client("s3").get_object(Bucket=bucket, Key=entry)["Body"].read() == b"{}"


def test_a_default_branch_job_writes_its_projects_cache_and_no_job_reaches_another_projects(
    local_stack, jobs
):
    bucket = local_stack.resources["ArtifactBucket"]
    p_prefix, q_prefix = cache_prefix(jobs["p"], "eu-west"), cache_prefix(jobs["q"], "eu-west")
    # Given Q's cache holds an entry
    q_entry = f"{q_prefix}entries/{'e' * 64}.json"
    client("s3").put_object(Bucket=bucket, Key=q_entry, Body=b"{}")

    # Then P's default-branch job puts a blob of P's cache (the same session a fork's lacks)
    main = _as(local_stack, jobs["main"], "s3")
    main.put_object(Bucket=bucket, Key=f"{p_prefix}blobs/{'c' * 64}", Body=b"bytes", IfNoneMatch="*")
    # but no job of P, trusted or not, reads or writes Q's cache, nor P's of another region
    q_key = {"pk": {"S": f"CACHE#{jobs['q']}/eu-west"}, "sk": {"S": "KEY#deps/x"}}
    for session in (jobs["main"], jobs["fork"]):
        s3 = _as(local_stack, session, "s3")
        assert refusal_code(lambda s3=s3: s3.get_object(Bucket=bucket, Key=q_entry)) == "AccessDenied"
        for key in (f"{q_prefix}blobs/{'d' * 64}", f"{cache_prefix(jobs['p'], 'us-east')}blobs/{'d' * 64}"):
            assert refusal_code(lambda s3=s3, key=key: s3.put_object(Bucket=bucket, Key=key, Body=b"x")) == (
                "AccessDenied"
            )
        dynamodb = _as(local_stack, session, "dynamodb")
        assert (
            refusal_code(lambda d=dynamodb: d.get_item(TableName=local_stack.table_name, Key=q_key))
            == "AccessDeniedException"
        )
    # while Q's own job reads it
    q_s3 = _as(local_stack, jobs["q_main"], "s3")
    assert q_s3.get_object(Bucket=bucket, Key=q_entry)["Body"].read() == b"{}"
