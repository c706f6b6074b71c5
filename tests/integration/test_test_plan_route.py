"""A sharded stage's test plan through the claim route (POST /regions/{region}/plans,
relevo_core.fleet.test_plans) on the local stack: made once per stage of a job, two shards racing
get one plan, a shard whose listing differs is refused, and a claim or a session of another job
gets nothing of it -- each refusal by its error."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from bench import harness
from relevo_agent.claim import new_claim_secret
from relevo_core.aws import client, in_this_context
from relevo_core.jobs.view import job_items_to_view
from relevo_core.models import job_objects, test_results
from relevo_core.models.job_objects import JobPrefix
from relevo_core.store.jobs import get_envelope, query_job_items
from tests.helpers.stack import job_record
from tests.helpers.state_machine import start_job

LISTING = b"".join(f"tests.test_m{i // 10}::test_{i}\n".encode() for i in range(30))
STAGES = [
    {
        "name": "test",
        "run": "true",
        "parallel": 2,
        "tests": {"junit": ["results/*.xml"], "plan": {"command": "cat tests.txt", "format": "lines"}},
    }
]


@pytest.fixture()
def claim_handler(local_stack) -> Any:
    role = client("iam").get_role(RoleName=local_stack.resources["AgentSessionsRole"])["Role"]["Arn"]
    harness.use_function_environment(local_stack, "AgentSessionsFunction")  # conftest restores os.environ
    with harness.as_role(role):
        handler = harness.cold_handler("agent_sessions")
    return role, handler


def _call(
    claim_handler, route: str, body: dict[str, Any], as_role: bool = True
) -> tuple[int, dict[str, Any]]:
    """The route's answer, the function running as its role (`as_role` False: the caller already
    runs as it -- as_role sets the process's environment, which two threads must not each do)."""
    role, handler = claim_handler
    event = harness.claim_event("eu-west", body, "arn:aws:sts::123456789012:assumed-role/agent/mac-t", route)
    if not as_role:
        response = handler.lambda_handler(event, harness.LambdaContext())
    else:
        with harness.as_role(role):
            response = handler.lambda_handler(event, harness.LambdaContext())
    return response["statusCode"], json.loads(response["body"])


def _stage_messages(stack, job_id: str, count: int, timeout: float = 30) -> list[dict[str, Any]]:
    """The job's next `count` stage messages in the region's queue (other jobs' are dropped)."""
    sqs, found = client("sqs"), []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        for message in sqs.receive_message(
            QueueUrl=stack.work_queues["eu-west"], WaitTimeSeconds=1, MaxNumberOfMessages=10
        ).get("Messages", []):
            body = json.loads(message["Body"])
            if body["job_id"] == job_id:
                found.append(body)
            sqs.delete_message(QueueUrl=stack.work_queues["eu-west"], ReceiptHandle=message["ReceiptHandle"])
    assert len(found) == count, f"{len(found)} of {count} stage messages"
    return found


def _claim_shards(stack, claim_handler, job_id: str) -> dict[int, dict[str, Any]]:
    """Both shards' messages claimed through the route, as relevo-agent claims them."""
    claimed: dict[int, dict[str, Any]] = {}
    for task in _stage_messages(stack, job_id, 2):
        attempt = {
            "job_id": job_id,
            "stage_index": task["stage_index"],
            "shard": task["shard"],
            "attempt": task["attempt"],
            "agent_id": f"mac-{task['shard']}",
            "claim_secret": new_claim_secret(),
        }
        status, granted = _call(
            claim_handler,
            "claims",
            {**attempt, "dispatch_key": task["dispatch_key"], "dispatch_token": task["task_token"]},
        )
        assert status == 200, granted
        claimed[task["shard"]] = {"attempt": attempt, "session": granted["session"]}
    return claimed


def _store_listing(
    stack, job_id: str, session: dict[str, Any], listing: bytes, owner: str | None = None
) -> str:
    """The listing put with a job's session (the agent's), at the key its sha256 gives in the
    job `owner` (default: the same job)."""
    sha = hashlib.sha256(listing).hexdigest()
    home = JobPrefix.of(get_envelope(stack.table_name, owner or job_id).artifact_uri)
    s3 = boto3.client(
        "s3",
        aws_access_key_id=session["access_key_id"],
        aws_secret_access_key=session["secret_access_key"],
        aws_session_token=session["session_token"],
    )
    s3.put_object(Bucket=home.bucket, Key=job_objects.test_listing_key(home, "test", sha), Body=listing)
    return sha


@pytest.mark.timeout(180)
def test_two_shards_racing_get_one_plan_made_once_and_recorded_on_the_job(
    local_stack, project_id, claim_handler
):
    # Given a job whose test stage runs in 2 shards with a plan, both shards claimed, each having
    # stored the same listing with its job's session
    job_id = start_job(local_stack, project_id, STAGES)
    claimed = _claim_shards(local_stack, claim_handler, job_id)
    sha = _store_listing(local_stack, job_id, claimed[0]["session"], LISTING)
    assert _store_listing(local_stack, job_id, claimed[1]["session"], LISTING) == sha
    # When both ask for the plan at the same instant
    start = threading.Barrier(2)

    def ask(shard: int) -> tuple[int, dict[str, Any]]:
        start.wait()
        return _call(claim_handler, "plans", {**claimed[shard]["attempt"], "listing_sha256": sha}, False)

    with harness.as_role(claim_handler[0]), ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(in_this_context(ask), [0, 1]))
    # Then both get the one plan, made by exactly one of them
    assert [status for status, _ in answers] == [200, 200], answers
    plans = [answer for _, answer in answers]
    assert len({(a["plan_key"], a["plan_sha256"]) for a in plans}) == 1
    assert sorted(a["made_now"] for a in plans) == [False, True]
    # And the plan stored is every listed test once, split by count (no earlier job), said
    home = JobPrefix.of(get_envelope(local_stack.table_name, job_id).artifact_uri)
    body = client("s3").get_object(Bucket=home.bucket, Key=plans[0]["plan_key"])["Body"].read()
    assert hashlib.sha256(body).hexdigest() == plans[0]["plan_sha256"]
    plan = test_results.TestPlan.model_validate_json(body)
    assert plan.by == "count" and plan.listing_sha256 == sha
    assert sorted(t.id for s in plan.shards for t in s.tests) == sorted(LISTING.decode().split())
    assert [a["tests"] for a in plans] == [15, 15]
    # And asked again, it is the same plan (once per stage of the job)
    status, again = _call(claim_handler, "plans", {**claimed[1]["attempt"], "listing_sha256": sha})
    assert status == 200 and again["plan_key"] == plans[0]["plan_key"] and not again["made_now"]
    assert job_record(local_stack, job_id)["status"] in ("running", "dispatched")
    # And the job view shows it: how it was split, each shard's tests and expected time
    shown = job_items_to_view(query_job_items(local_stack.table_name, job_id))["stages"][0]["test_plan"]
    assert shown["by"] == "count" and shown["listing_sha256"] == sha
    assert shown["shards"] == [
        {"shard": 0, "tests": 15, "expected_sec": 0},
        {"shard": 1, "tests": 15, "expected_sec": 0},
    ]


@pytest.mark.timeout(180)
def test_a_shard_whose_listing_differs_is_refused_and_another_job_gets_nothing(
    local_stack, project_id, claim_handler
):
    # Given a job's plan made from shard 0's listing
    job_id = start_job(local_stack, project_id, STAGES)
    claimed = _claim_shards(local_stack, claim_handler, job_id)
    sha = _store_listing(local_stack, job_id, claimed[0]["session"], LISTING)
    status, made = _call(claim_handler, "plans", {**claimed[0]["attempt"], "listing_sha256": sha})
    assert status == 200 and made["made_now"], made
    # When shard 1 listed one test fewer
    other = _store_listing(local_stack, job_id, claimed[1]["session"], LISTING.rsplit(b"\n", 2)[0] + b"\n")
    status, refused = _call(claim_handler, "plans", {**claimed[1]["attempt"], "listing_sha256": other})
    # Then it is refused, saying the two listings
    assert (status, refused["error"]) == (409, "TEST_LISTING_DIFFERS"), refused
    assert refused["details"]["plan_listing_sha256"] == sha

    # Given a job of another project, with its shards claimed
    second = start_job(local_stack, f"{project_id}-b", STAGES)
    theirs = _claim_shards(local_stack, claim_handler, second)
    # When its session puts a listing where the first job's is read from
    with pytest.raises(ClientError) as denied:
        _store_listing(local_stack, second, theirs[0]["session"], b"evil::test\n", owner=job_id)
    # Then S3 refuses it (the job session's policy is its own job's prefix)
    assert denied.value.response["Error"]["Code"] == "AccessDenied"
    # And its claim, shown for the first job's shard, gets no plan of it
    foreign = {**theirs[0]["attempt"], "job_id": job_id, "listing_sha256": sha}
    status, refused = _call(claim_handler, "plans", foreign)
    assert (status, refused["error"]) == (409, "ATTEMPT_NOT_HELD"), refused


@pytest.mark.timeout(120)
def test_a_listing_never_stored_or_not_of_its_sha256_is_refused(local_stack, project_id, claim_handler):
    job_id = start_job(local_stack, project_id, STAGES)
    claimed = _claim_shards(local_stack, claim_handler, job_id)
    status, refused = _call(claim_handler, "plans", {**claimed[0]["attempt"], "listing_sha256": "0" * 64})
    assert (status, refused["error"]) == (404, "TEST_LISTING_NOT_FOUND"), refused
