"""A sharded stage's test plan, made once per stage of a job (POST /regions/{region}/plans):
each shard's agent lists the stage's tests, stores the listing under the job's prefix with the
job's session, and asks for the plan here with the listing's sha256, for the shard its claim holds.

The first to ask makes it: the listing read (relevo_core.shard_plans.listing), durations from the
project's earlier jobs of the stage (their shards' results documents), the split
(relevo_core.shard_plans.split), the plan stored at its shard's own key and recorded on the job
by a conditional put (store/test_plans). The others get the plan on record -- when their listing
is the same one: a shard whose listing differs is refused (TEST_LISTING_DIFFERS), and its agent
fails the shard for good (Relevo.Fatal.TestPlan), for the shards would not be checked against
one list.

Who may: the claim that holds that shard's attempt now (agent, attempt, claim secret, live lease:
relevo_core.fleet.claims), so a zombie or another job's agent gets ATTEMPT_NOT_HELD or
ATTEMPT_ENDED. Every location is derived from the job and the request (the listing's key from
its sha256, the plan's from the shard), never read from what an agent wrote, and an earlier
job's results key is checked against that job's prefix (models/job_objects.object_key).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from relevo_core.aws import client, error_code
from relevo_core.config.agent_sessions import AgentSessionsSettings
from relevo_core.fleet.claims import known_region, refuse_unless_holding
from relevo_core.models.agent_session import PlanGranted, PlanRequest
from relevo_core.models.envelope import JobEnvelope, read_envelope
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.job_objects import JobPrefix, object_key, test_listing_key, test_plan_key
from relevo_core.models.test_results import RESULTS_SCHEMA, ResultsDocument
from relevo_core.shard_plans.listing import ListingInvalid, read_listing
from relevo_core.shard_plans.split import HISTORY_JOBS, job_durations, split_tests
from relevo_core.store import stage_claims, test_plans
from relevo_core.store.codec import envelope_of
from relevo_core.store.jobs import get_job_record, query_job_items
from relevo_core.store.project_jobs import jobs_of_project

log = logging.getLogger(__name__)

# How many of the project's latest jobs are looked at for HISTORY_JOBS with results of the stage.
JOBS_LOOKED_AT = 20


def plan_for_shard(
    settings: AgentSessionsSettings, region: str, request: PlanRequest, now: datetime
) -> PlanGranted:
    known_region(settings, region)
    table = settings.table_name
    if request.shard is None:
        raise RelevoError(
            ErrorCode.TEST_PLAN_NOT_DECLARED, "a test plan is a sharded stage's: name the shard"
        )
    refuse_unless_holding(
        request,
        stage_claims.claim_on_record(table, request.job_id, request.stage_index, request.shard),
        now,
    )
    envelope = read_envelope(envelope_of(get_job_record(table, request.job_id)))
    if envelope.region_affinity != region:
        raise RelevoError(ErrorCode.DISPATCH_NOT_FOUND, f"{request.job_id} is not a job of region {region!r}")
    stage = envelope.stages[request.stage_index]
    settings_of_plan = stage.tests.plan if stage.tests is not None else None
    if settings_of_plan is None or stage.parallel is None:
        raise RelevoError(
            ErrorCode.TEST_PLAN_NOT_DECLARED, f"stage {stage.name} of {request.job_id} declares no tests.plan"
        )
    on_record = test_plans.plan_on_record(table, request.job_id, request.stage_index)
    made_now = False
    if on_record is None:
        home = JobPrefix.of(envelope.artifact_uri)
        listing = _stored_listing(home, stage.name, request.listing_sha256)
        try:
            tests = read_listing(listing, settings_of_plan.format)
        except ListingInvalid as invalid:
            raise RelevoError(
                ErrorCode.TEST_LISTING_INVALID,
                f"the test listing of stage {stage.name} is not {settings_of_plan.format} output: {invalid}",
            ) from None
        plan = split_tests(
            stage.name,
            tests,
            stage.parallel,
            request.listing_sha256,
            earlier_durations(table, envelope, stage.name),
            allow_empty=settings_of_plan.allow_empty,
        )
        plan_key = test_plan_key(home, stage.name, request.shard)
        body = plan.model_dump_json().encode()
        client("s3").put_object(Bucket=home.bucket, Key=plan_key, Body=body, ContentType="application/json")
        record = {
            "stage": stage.name,
            "listing_sha256": plan.listing_sha256,
            "plan_key": plan_key,
            "plan_sha256": hashlib.sha256(body).hexdigest(),
            "by": plan.by,
            "history_jobs": plan.history_jobs,
            "allow_empty": plan.allow_empty,
            "shards": [
                {"shard": shard.shard, "tests": len(shard.tests), "expected_sec": shard.expected_sec}
                for shard in plan.shards
            ],
            "made_by": {"shard": request.shard, "agent_id": request.agent_id, "attempt": request.attempt},
            "made_at": now.isoformat(),
            "ttl": envelope.ttl,
        }
        on_record, made_now = test_plans.record_plan(table, request.job_id, request.stage_index, record)
    if on_record["listing_sha256"] != request.listing_sha256:
        raise RelevoError(
            ErrorCode.TEST_LISTING_DIFFERS,
            f"shard {request.shard} listed other tests (sha256 {request.listing_sha256}) than the plan "
            f"of stage {stage.name} was made of (sha256 {on_record['listing_sha256']}): its shards "
            "would not be checked against one list",
            plan_listing_sha256=on_record["listing_sha256"],
        )
    mine = next(shard for shard in on_record["shards"] if shard["shard"] == request.shard)
    return PlanGranted(
        plan_key=on_record["plan_key"],
        plan_sha256=on_record["plan_sha256"],
        listing_sha256=on_record["listing_sha256"],
        by=on_record["by"],
        tests=mine["tests"],
        expected_sec=mine["expected_sec"],
        made_now=made_now,
    )


def _stored_listing(home: JobPrefix, stage: str, sha256: str) -> bytes:
    """The listing at the key its sha256 gives, when it is those very bytes."""
    listing_key = test_listing_key(home, stage, sha256)
    try:
        listing: bytes = client("s3").get_object(Bucket=home.bucket, Key=listing_key)["Body"].read()
    except ClientError as exc:
        # Without s3:ListBucket a missing key answers 403, not 404 (Amazon S3 API Reference, GetObject).
        if error_code(exc) not in ("NoSuchKey", "404", "AccessDenied", "403"):
            raise
        raise RelevoError(
            ErrorCode.TEST_LISTING_NOT_FOUND,
            f"no test listing stored at {home.uri(listing_key)}: store it there first (with the job's "
            "session)",
        ) from None
    if hashlib.sha256(listing).hexdigest() != sha256:
        raise RelevoError(
            ErrorCode.TEST_LISTING_NOT_FOUND,
            f"the listing stored at {home.uri(listing_key)} is not the one of sha256 {sha256}",
        )
    return listing


def earlier_durations(table: str, envelope: JobEnvelope, stage: str) -> list[dict[str, float]]:
    """Per test, the seconds it took in each of the project's latest HISTORY_JOBS jobs that have
    results of the stage (their shards' or its own record's `tests.results_key`, the last
    attempt's), newest first; of the latest JOBS_LOOKED_AT jobs only."""
    found: list[dict[str, float]] = []
    earlier = (
        record
        for record in jobs_of_project(table, envelope.project)
        if record.get("pk") != f"JOB#{envelope.job_id}"
    )
    for record in itertools.islice(earlier, JOBS_LOOKED_AT):
        durations = _durations_of_job(table, record, stage)
        if durations:
            found.append(durations)
            if len(found) == HISTORY_JOBS:
                break
    return found


def _durations_of_job(table: str, record: dict[str, Any], stage: str) -> dict[str, float]:
    try:
        earlier = read_envelope(envelope_of(record))
    except (RelevoError, KeyError, ValueError):
        return {}
    home = JobPrefix.of(earlier.artifact_uri)
    job_id = earlier.job_id
    tests = []
    for item in query_job_items(table, job_id):
        summary = item.get("tests")
        if item.get("stage_name") != stage or not isinstance(summary, dict) or not summary.get("results_key"):
            continue
        try:
            key = object_key(home, home.uri(str(summary["results_key"])), (item["pk"], item["sk"]))
            body = client("s3").get_object(Bucket=home.bucket, Key=key)["Body"].read()
            document = ResultsDocument.model_validate_json(body)
        except (RelevoError, ClientError, ValueError) as exc:
            log.warning("results of %s %s not used for the split: %s", job_id, item["sk"], exc)
            continue
        if document.schema_version == RESULTS_SCHEMA:
            tests.extend(document.tests)
    return job_durations(tests)
