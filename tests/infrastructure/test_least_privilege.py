"""The attacker's matrix with the IAM evaluator (relevo_local.iam_evaluation), on the policies of the
translated template as deployed (issue 28): what an agent of region eu-west may do on its own
credentials (AgentPolicy) and with job X's credentials (JobPolicy, its session tagged with X),
and that everything else is refused. The same matrix runs on the local stack under its own IAM
enforcement with the credentials an agent really holds (tests/integration/test_agent_role.py).

Request contexts follow "Using IAM policy conditions for fine-grained access control" (DynamoDB
Developer Guide: dynamodb:LeadingKeys is the partition key, dynamodb:Attributes the attribute
names a request names) and "IAM policy elements: Variables and tags" (aws:PrincipalTag/<key> is
the session's tag).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from relevo_core.fleet.job_credentials import LINEAGE_TAGS, NO_GRANT
from relevo_local.iam_evaluation import PolicyDecision, Request, evaluate
from relevo_local.template import load_sam_template
from relevo_tools import iam_policies

ROOT = Path(__file__).resolve().parents[2]
X, Y, P, Q = "job_" + "x" * 26, "job_" + "y" * 26, "app-p", "app-q"


@pytest.fixture(scope="module")
def rendered() -> tuple[dict[str, Any], iam_policies.Renderer, dict[str, dict[str, Any]]]:
    sam = load_sam_template(ROOT / "template.yaml")
    cfn, renderer = iam_policies.render(sam, ROOT)
    documents = {
        d.holder: d.document
        for d in iam_policies.policy_documents(cfn, sam, renderer)
        if d.kind == "identity"
    }
    return cfn, renderer, documents


def _tags(
    job: str = X,
    project: str = P,
    signing: str = NO_GRANT,
    git: str = NO_GRANT,
    lineage: tuple[str, ...] = (),
    log: str | None = None,
    release: str = NO_GRANT,
    cache_write: str = NO_GRANT,
) -> dict[str, str]:
    tags = {
        "job": job,
        "project": project,
        "region": "eu-west",
        "signing": signing,
        "git": git,
        "release": release,
        "log": log or job,
        "cache": f"{project}/eu-west",
        "cache_write": cache_write,
    }
    for index, name in enumerate(LINEAGE_TAGS):
        tags[name] = lineage[index] if index < len(lineage) else NO_GRANT
    return {f"aws:PrincipalTag/{key}": value for key, value in tags.items()}


def _dynamodb(table_arn: str, action: str, pk: str, *attributes: str) -> Request:
    context: dict[str, Any] = {"dynamodb:LeadingKeys": [pk]}
    if attributes:
        context["dynamodb:Attributes"] = ["pk", "sk", *attributes]
    return Request(f"dynamodb:{action}", table_arn, context=context)


def _decide(
    documents: list[dict[str, Any]], request: Request, tags: dict[str, str] | None = None
) -> PolicyDecision:
    return evaluate(
        documents, Request(request.action, request.resource, context={**request.context, **(tags or {})})
    )


def _cases(renderer: iam_policies.Renderer) -> dict[str, Request]:
    table = renderer.get_att("Table", "Arn")
    bucket = renderer.get_att("ArtifactBucket", "Arn")
    secret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:relevo/relevo"
    return {
        # What X's own attempt does.
        "read X's envelope": _dynamodb(table, "GetItem", f"JOB#{X}"),
        "write X's stage attempt": _dynamodb(
            table, "UpdateItem", f"STAGES#{X}", "status", "receipt", "outputs"
        ),
        "write X's log": _dynamodb(table, "PutItem", f"LOGS#{X}", "data", "ttl"),
        "write X's artifact records": _dynamodb(table, "PutItem", f"ARTIFACTS#{X}", "sha256"),
        "put X's objects": Request("s3:PutObject", f"{bucket}/{P}/{X}/build/app.ipa"),
        # A shard's files go under <stage>/shard-<k>/ (docs/parallel-stages.md), still the job's prefix:
        # a trailing * matches across "/" too (IAM User Guide, "IAM JSON policy elements: Resource").
        "put X's shard's objects": Request("s3:PutObject", f"{bucket}/{P}/{X}/test/shard-1/app.ipa"),
        # Listing under its own prefix: what S3 asks before it tells a missing key from a refusal
        # (Amazon S3 API Reference, GetObject, "Permissions").
        "list X's prefix": Request(
            "s3:ListBucket", bucket, context={"s3:prefix": f"{P}/{X}/.relevo-handoff/packs/{'0' * 64}"}
        ),
        # What nobody's agent may do. A task token is a capability (issue 41): no job session reads
        # one (the job's token partition, with or without a projection) or answers any task.
        "answer a stage task": Request("states:SendTaskSuccess", "*"),
        "fail a stage task": Request("states:SendTaskFailure", "*"),
        "heartbeat a stage task": Request("states:SendTaskHeartbeat", "*"),
        "read X's task tokens": _dynamodb(table, "GetItem", f"TOKENS#{X}"),
        "read X's approval token by its attributes": _dynamodb(
            table, "GetItem", f"TOKENS#{X}", "token", "stage"
        ),
        "query X's task tokens": _dynamodb(table, "Query", f"TOKENS#{X}"),
        "query X's run tokens by their attributes": _dynamodb(
            table, "Query", f"TOKENS#{X}", "token", "agent_id", "attempt"
        ),
        "write X's task tokens": _dynamodb(table, "PutItem", f"TOKENS#{X}", "token"),
        "X's outcome": _dynamodb(table, "UpdateItem", f"JOB#{X}", "status"),
        "X's envelope": _dynamodb(table, "UpdateItem", f"JOB#{X}", "envelope"),
        "X's claim": _dynamodb(table, "UpdateItem", f"STAGES#{X}", "claim_id"),
        "Y's envelope": _dynamodb(table, "GetItem", f"JOB#{Y}"),
        "Y's stage attempt": _dynamodb(table, "UpdateItem", f"STAGES#{Y}", "status"),
        "Y's log": _dynamodb(table, "PutItem", f"LOGS#{Y}", "data"),
        "Y's artifact records": _dynamodb(table, "PutItem", f"ARTIFACTS#{Y}", "sha256"),
        "Y's objects": Request("s3:PutObject", f"{bucket}/{Q}/{Y}/build/app.ipa"),
        "Y's handoff": Request("s3:GetObject", f"{bucket}/{Q}/{Y}/.relevo-handoff/build/manifest.json"),
        "another job of P": Request("s3:PutObject", f"{bucket}/{P}/{Y}/build/app.ipa"),
        "a shard's object of another job of P": Request(
            "s3:PutObject", f"{bucket}/{P}/{Y}/test/shard-1/app.ipa"
        ),
        "list Y's prefix": Request("s3:ListBucket", bucket, context={"s3:prefix": f"{Q}/{Y}/"}),
        "list another job of P": Request("s3:ListBucket", bucket, context={"s3:prefix": f"{P}/{Y}/"}),
        "list X's project": Request("s3:ListBucket", bucket, context={"s3:prefix": f"{P}/"}),
        "list the bucket": Request("s3:ListBucket", bucket),
        "Q's signing identity": Request(
            "secretsmanager:GetSecretValue", f"{secret}/_signing/eu-west/{Q}/dist.p12-AbCdEf"
        ),
        "P's signing identity": Request(
            "secretsmanager:GetSecretValue", f"{secret}/_signing/eu-west/{P}/dist.p12-AbCdEf"
        ),
        "Q's checkout credentials": Request(
            "secretsmanager:GetSecretValue", f"{secret}/_git/{Q}/token-AbCdEf"
        ),
        "a webhook secret": Request("secretsmanager:GetSecretValue", f"{secret}/{P}/github-AbCdEf"),
        "P's release key": Request("secretsmanager:GetSecretValue", f"{secret}/_release/{P}/asc.json-AbCdEf"),
        "Q's release key": Request("secretsmanager:GetSecretValue", f"{secret}/_release/{Q}/asc.json-AbCdEf"),
        "a project's definition": _dynamodb(table, "PutItem", f"PROJECT#{P}"),
        "a project lock": _dynamodb(table, "PutItem", f"LOCK#{P}"),
        "start an execution": Request("states:StartExecution", renderer.ref("JobStateMachine")),
    }


JOB_MAY = {
    "read X's envelope",
    "write X's stage attempt",
    "write X's log",
    "write X's artifact records",
    "put X's objects",
    "put X's shard's objects",
    "list X's prefix",
}


def test_job_xs_session_does_its_own_job_and_nothing_else(rendered):
    _, renderer, documents = rendered
    job = [documents["JobPolicy"]]
    for what, request in _cases(renderer).items():
        expected = PolicyDecision.ALLOW if what in JOB_MAY else PolicyDecision.NO_MATCH
        assert _decide(job, request, _tags()) is expected, what


def test_a_session_of_the_job_role_without_tags_is_refused_everything(rendered):
    """A variable with no value makes its statement not apply: a session minted without the
    tags (by mistake) reaches no partition, object, secret or task."""
    _, renderer, documents = rendered
    job = [documents["JobPolicy"]]
    for what, request in _cases(renderer).items():
        assert _decide(job, request) is PolicyDecision.NO_MATCH, what


def test_the_job_role_holds_no_task_power_at_all(rendered):
    """SendTask* take no resource type (Service Authorization Reference, Step Functions), so any
    grant of them would reach every token a session could come by: the JobPolicy names none."""
    _, _, documents = rendered
    actions = [
        action
        for statement in documents["JobPolicy"]["Statement"]
        for action in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    ]
    assert not [action for action in actions if action.lower().startswith("states:")], actions


def test_only_the_state_machine_writes_task_tokens_and_only_the_answering_functions_read_them(rendered):
    """The job's token partition: put by the state machine (in the transaction that makes a task
    wait), read by the claim function (run tokens, for the claim that holds the attempt) and the
    triggers function (approve, resolve); no agent, on its own credentials or a job's."""
    _, renderer, documents = rendered
    table = renderer.get_att("Table", "Arn")
    read = _dynamodb(table, "GetItem", f"TOKENS#{X}")
    put = _dynamodb(table, "PutItem", f"TOKENS#{X}", "token", "agent_id", "attempt", "written_at", "ttl")
    machine = [document for holder, document in documents.items() if holder.startswith("JobStateMachine")]
    assert machine and any(_decide([document], put) is PolicyDecision.ALLOW for document in machine)
    assert _decide([documents["AgentSessionsPolicy"]], read) is PolicyDecision.ALLOW
    assert _decide([documents["AgentSessionsPolicy"]], put) is PolicyDecision.NO_MATCH
    assert (
        _decide([documents["AgentSessionsPolicy"]], Request("states:SendTaskHeartbeat", "*"))
        is PolicyDecision.ALLOW
    )
    for agent_side in ("AgentPolicyeuwest", "JobPolicy"):
        assert _decide([documents[agent_side]], read, _tags()) is PolicyDecision.NO_MATCH, agent_side
        assert _decide([documents[agent_side]], put, _tags()) is PolicyDecision.NO_MATCH, agent_side


def test_the_agent_role_alone_touches_no_job_object_secret_or_task(rendered):
    _, renderer, documents = rendered
    agent = [documents["AgentPolicyeuwest"]]
    for what, request in _cases(renderer).items():
        assert _decide(agent, request) is PolicyDecision.NO_MATCH, what
    table = renderer.get_att("Table", "Arn")
    assert _decide(agent, _dynamodb(table, "PutItem", "AGENTS#eu-west", "status")) is PolicyDecision.ALLOW
    assert _decide(agent, _dynamodb(table, "PutItem", "AGENTS#us-east", "status")) is PolicyDecision.NO_MATCH
    assert _decide(agent, _dynamodb(table, "BatchGetItem", "PAUSES#eu-west")) is PolicyDecision.ALLOW
    assert _decide(agent, _dynamodb(table, "PutItem", "PAUSES#eu-west", "until")) is PolicyDecision.NO_MATCH
    api = renderer.ref("Api")
    route = f"arn:aws:execute-api:us-east-1:123456789012:{api}/v1/POST/regions"
    assert _decide(agent, Request("execute-api:Invoke", f"{route}/eu-west/claims")) is PolicyDecision.ALLOW
    assert _decide(agent, Request("execute-api:Invoke", f"{route}/eu-west/sessions")) is PolicyDecision.ALLOW
    # An attempt's answers go through its region's routes, which check the claim (no task token leaves the
    # stack).
    for answer in ("accepts", "heartbeats", "outcomes"):
        assert (
            _decide(agent, Request("execute-api:Invoke", f"{route}/eu-west/{answer}")) is PolicyDecision.ALLOW
        ), answer
        assert (
            _decide(agent, Request("execute-api:Invoke", f"{route}/us-east/{answer}"))
            is PolicyDecision.NO_MATCH
        ), answer
    assert _decide(agent, Request("execute-api:Invoke", f"{route}/us-east/claims")) is PolicyDecision.NO_MATCH
    assert (
        _decide(
            agent,
            Request(
                "execute-api:Invoke",
                f"arn:aws:execute-api:us-east-1:123456789012:{api}/v1/POST/jobs/{X}/approve",
            ),
        )
        is PolicyDecision.NO_MATCH
    )


def test_an_effects_session_reads_its_own_projects_release_keys_only(rendered):
    # Given the job policy, and the sessions of a stage with an effect and of one without
    _, renderer, documents = rendered
    job = [documents["JobPolicy"]]
    cases = _cases(renderer)
    effect, command = _tags(release=P), _tags()

    # Then the effect's session reads its project's release keys and no other project's; a
    # command's session reads none, not even its own project's
    assert _decide(job, cases["P's release key"], effect) is PolicyDecision.ALLOW
    assert _decide(job, cases["Q's release key"], effect) is PolicyDecision.NO_MATCH
    assert _decide(job, cases["P's release key"], command) is PolicyDecision.NO_MATCH
    assert _decide(job, cases["Q's checkout credentials"], effect) is PolicyDecision.NO_MATCH


def test_a_jobs_session_reads_its_projects_caches_and_writes_them_only_when_its_ref_may(rendered):
    # Given the job policy, the session of a default-branch job of P (cache_write P's scope) and of
    # a pull request's job of P (cache_write "-")
    _, renderer, documents = rendered
    job = [documents["JobPolicy"]]
    table = renderer.get_att("Table", "Arn")
    bucket = renderer.get_att("ArtifactBucket", "Arn")
    trusted, pull_request = _tags(cache_write=f"{P}/eu-west"), _tags()
    entry = f"{bucket}/_caches/{P}/eu-west/entries/{'e' * 64}.json"
    blob = f"{bucket}/_caches/{P}/eu-west/blobs/{'b' * 64}"

    # Then both read P's cache in their region (objects, records, a missing key answering 404) and
    # count a hit (last_used_at and hits only)
    for tags in (trusted, pull_request):
        assert _decide(job, Request("s3:GetObject", entry), tags) is PolicyDecision.ALLOW
        assert _decide(job, _dynamodb(table, "Query", f"CACHE#{P}/eu-west"), tags) is PolicyDecision.ALLOW
        listing = Request("s3:ListBucket", bucket, context={"s3:prefix": f"_caches/{P}/eu-west/blobs/x"})
        assert _decide(job, listing, tags) is PolicyDecision.ALLOW
        hit = _dynamodb(table, "UpdateItem", f"CACHE#{P}/eu-west", "last_used_at", "hits")
        assert _decide(job, hit, tags) is PolicyDecision.ALLOW
        forged = _dynamodb(table, "UpdateItem", f"CACHE#{P}/eu-west", "manifest_sha256")
        assert _decide(job, forged, tags) is PolicyDecision.NO_MATCH
    # only the trusted ref's session puts an entry, a blob or a record
    for request in (
        Request("s3:PutObject", entry),
        Request("s3:PutObject", blob),
        _dynamodb(table, "PutItem", f"CACHE#{P}/eu-west", "cache_key"),
    ):
        assert _decide(job, request, trusted) is PolicyDecision.ALLOW, request
        assert _decide(job, request, pull_request) is PolicyDecision.NO_MATCH, request
    # and neither reaches Q's cache, nor P's in another region
    for other in (f"_caches/{Q}/eu-west", f"_caches/{P}/us-east"):
        for request in (
            Request("s3:GetObject", f"{bucket}/{other}/entries/{'e' * 64}.json"),
            Request("s3:PutObject", f"{bucket}/{other}/blobs/{'b' * 64}"),
            _dynamodb(table, "Query", "CACHE#" + other.removeprefix("_caches/")),
        ):
            assert _decide(job, request, trusted) is PolicyDecision.NO_MATCH, request


def test_a_signing_plans_session_reads_its_projects_identities_only_and_a_reruns_its_lineage_read_only(
    rendered,
):
    _, renderer, documents = rendered
    job = [documents["JobPolicy"]]
    cases = _cases(renderer)
    signing = _tags(job=Y, project=Q, signing=f"eu-west/{Q}", git=Q)
    assert _decide(job, cases["Q's signing identity"], signing) is PolicyDecision.ALLOW
    assert _decide(job, cases["Q's checkout credentials"], signing) is PolicyDecision.ALLOW
    assert _decide(job, cases["P's signing identity"], signing) is PolicyDecision.NO_MATCH
    other_region = Request(
        "secretsmanager:GetSecretValue",
        cases["Q's signing identity"].resource.replace("/eu-west/", "/us-east/"),
    )
    assert _decide(job, other_region, signing) is PolicyDecision.NO_MATCH
    # A rerun of Y (job X standing on Y): Y's records and objects read, never written.
    table, bucket = renderer.get_att("Table", "Arn"), renderer.get_att("ArtifactBucket", "Arn")
    rerun = _tags(job=X, project=Q, lineage=(Y,))
    assert _decide(job, _dynamodb(table, "Query", f"STAGES#{Y}"), rerun) is PolicyDecision.ALLOW
    assert (
        _decide(job, Request("s3:GetObject", f"{bucket}/{Q}/{Y}/.relevo-handoff/build/manifest.json"), rerun)
        is PolicyDecision.ALLOW
    )
    assert (
        _decide(job, Request("s3:PutObject", f"{bucket}/{Q}/{Y}/.relevo-handoff/build/manifest.json"), rerun)
        is PolicyDecision.NO_MATCH
    )
    assert (
        _decide(job, _dynamodb(table, "UpdateItem", f"STAGES#{Y}", "status"), rerun)
        is PolicyDecision.NO_MATCH
    )
    assert (
        _decide(
            job,
            Request(
                "s3:ListBucket",
                bucket,
                context={"s3:prefix": f"{Q}/{Y}/.relevo-handoff/manifests/build.1.json"},
            ),
            rerun,
        )
        is PolicyDecision.ALLOW
    )
    assert (
        _decide(
            job,
            Request(
                "s3:ListBucket",
                bucket,
                context={"s3:prefix": f"{P}/{Y}/.relevo-handoff/manifests/build.1.json"},
            ),
            rerun,
        )
        is PolicyDecision.NO_MATCH
    )


def test_only_the_claim_function_may_mint_a_job_session(rendered):
    cfn, renderer, documents = rendered
    trust = renderer.value(cfn["Resources"]["JobRole"]["Properties"]["AssumeRolePolicyDocument"])
    role = renderer.get_att("JobRole", "Arn")
    minter = {"AWS": renderer.get_att("AgentSessionsRole", "Arn")}
    for action in ("sts:AssumeRole", "sts:TagSession"):
        assert evaluate([trust], Request(action, role, principal=minter)) is PolicyDecision.ALLOW
    agent_role = {"AWS": renderer.get_att("AgentRoleeuwest", "Arn")}
    assert evaluate([trust], Request("sts:AssumeRole", role, principal=agent_role)) is PolicyDecision.NO_MATCH
    assert (
        _decide([documents["AgentPolicyeuwest"]], Request("sts:AssumeRole", role)) is PolicyDecision.NO_MATCH
    )
    assert (
        _decide([documents["AgentSessionsPolicy"]], Request("sts:TagSession", role)) is PolicyDecision.ALLOW
    )


def test_a_shards_session_writes_its_own_log_partition_and_no_siblings_or_other_jobs(rendered):
    """Each shard logs to a partition of its own (relevo_core.store.keys.log_partition), and its
    session's `log` tag names that partition only (relevo_core.fleet.job_credentials): dynamodb:LeadingKeys
    compares whole partition keys ("Using IAM policy conditions for fine-grained access control",
    DynamoDB Developer Guide), so neither a sibling shard's log, the job's own nor another job's matches."""
    from relevo_core.fleet.job_credentials import session_tags
    from relevo_core.store.keys import log_pk

    _, renderer, documents = rendered
    job, table = [documents["JobPolicy"]], renderer.get_att("Table", "Arn")
    # Given the session of shard 0 of X's stage 1, tagged as the claim route tags it
    shard_tag = session_tags(_envelope(X), [], stage_index=1, shard=0)["log"]
    shard_session = _tags(log=shard_tag)

    def writes(pk: str, tags: dict[str, str]) -> PolicyDecision:
        return _decide(job, _dynamodb(table, "PutItem", pk, "data", "ttl"), tags)

    # Then it writes (and reads back the tail of) its own partition
    assert writes(log_pk(X, 1, 0), shard_session) is PolicyDecision.ALLOW
    assert _decide(job, _dynamodb(table, "Query", log_pk(X, 1, 0)), shard_session) is PolicyDecision.ALLOW
    # And nothing else's: a sibling shard's, another stage's shard, the job's own, another job's
    for other in (
        log_pk(X, 1, 1),
        log_pk(X, 2, 0),
        log_pk(X),
        log_pk(Y, 1, 0),
        log_pk(Y),
        f"LOGS#{X}/01",
        f"LOGS#{X}/",
    ):
        assert writes(other, shard_session) is PolicyDecision.NO_MATCH, other
    # And a stage without shards writes the job's own log, and no shard's
    plain = _tags()
    assert writes(log_pk(X), plain) is PolicyDecision.ALLOW
    assert writes(log_pk(X, 1, 0), plain) is PolicyDecision.NO_MATCH


def _envelope(job_id: str):
    from relevo_core.models.project import Project
    from relevo_core.plan_limits import largest_envelope

    project = Project.model_validate(
        {
            "id": P,
            "repo": "acme/app",
            "region_affinity": "eu-west",
            "stages": [{"name": "build", "run": "make"}, {"name": "test", "run": "make test", "parallel": 2}],
        }
    )
    return largest_envelope(project).model_copy(update={"job_id": job_id})


def test_the_functions_that_say_why_a_job_waits_read_its_projects_lock_and_nothing_else_of_it(rendered):
    # A job queued behind its project says whose approval gate holds it (the lock's `gate`,
    # relevo_core.jobs.project_wait): the job view, the listing, the queue and the log page read it.
    _, renderer, documents = rendered
    table = renderer.get_att("Table", "Arn")
    for holder in ("JobsFunctionRole", "QueueFunctionRole", "JobOutputFunctionRole"):
        assert (
            _decide([documents[holder]], _dynamodb(table, "GetItem", f"LOCK#{P}")) is PolicyDecision.ALLOW
        ), holder
        for action in ("UpdateItem", "PutItem", "DeleteItem"):
            assert (
                _decide([documents[holder]], _dynamodb(table, action, f"LOCK#{P}")) is PolicyDecision.NO_MATCH
            ), (holder, action)
    assert (
        _decide([documents["JobPolicy"]], _dynamodb(table, "GetItem", f"LOCK#{P}"), _tags())
        is PolicyDecision.NO_MATCH
    )


def test_only_the_claim_function_moves_a_projects_build_numbers_and_writes_only_the_jobs_number(rendered):
    """Build numbers (relevo_core.store.build_numbers): the counter item and the job record's
    build_number are written by the claim function alone, in one transaction (each Update
    authorized as UpdateItem on its item), and nothing else of the job record; no agent, on its
    own credentials or a job's, reads or moves a counter."""
    _, renderer, documents = rendered
    table = renderer.get_att("Table", "Arn")
    # Given the requests of an allocation, and the writes it must not be able to make
    move = _dynamodb(table, "UpdateItem", f"BUILDNUMBERS#{P}", "last_number")
    read = _dynamodb(table, "GetItem", f"BUILDNUMBERS#{P}", "last_number")
    number = _dynamodb(table, "UpdateItem", f"JOB#{X}", "build_number")
    refused = {
        "the job's status": _dynamodb(table, "UpdateItem", f"JOB#{X}", "build_number", "status"),
        "the job's envelope": _dynamodb(table, "UpdateItem", f"JOB#{X}", "envelope"),
        "a counter put whole": _dynamodb(table, "PutItem", f"BUILDNUMBERS#{P}", "last_number"),
        "a counter deleted": _dynamodb(table, "DeleteItem", f"BUILDNUMBERS#{P}"),
        "another attribute of a counter": _dynamodb(table, "UpdateItem", f"BUILDNUMBERS#{P}", "floor"),
    }
    claims = [documents["AgentSessionsPolicy"]]
    # When the claim function's policy decides them, then it may make exactly the allocation's
    for request in (move, read, number):
        assert _decide(claims, request) is PolicyDecision.ALLOW, request
    for what, request in refused.items():
        assert _decide(claims, request) is PolicyDecision.NO_MATCH, what
    # and besides it only the intake functions could: their grant on the table (the queue counter,
    # whole job records: a rerun's carries its build number) names no partition; they never move one
    movers = {
        holder
        for holder, document in documents.items()
        if _decide([document], move, _tags()) is PolicyDecision.ALLOW
    }
    intake = {"TriggersFunctionRole", "ScheduleTriggerFunctionRole", "WebhookFunctionRole"}
    assert "AgentSessionsPolicy" in movers and movers <= {"AgentSessionsPolicy", *intake}, movers
    # and neither an agent nor a job session reads one or writes a job's number
    for agent_side in ("AgentPolicyeuwest", "JobPolicy"):
        for request in (move, read, number):
            assert _decide([documents[agent_side]], request, _tags()) is PolicyDecision.NO_MATCH, agent_side


def test_the_job_policy_fits_a_managed_policys_size_with_the_longest_bucket_name(rendered):
    """A managed policy holds at most 6,144 characters, whitespace not counted ("IAM and AWS STS
    quotas", IAM User Guide): JobPolicy names the artifact bucket's ARN in many statements, and
    CloudFormation may name the bucket with up to 63 characters."""
    _, renderer, documents = rendered
    text = re.sub(r"\s", "", json.dumps(documents["JobPolicy"], separators=(",", ":")))
    bucket = renderer.get_att("ArtifactBucket", "Arn").removeprefix("arn:aws:s3:::")
    longest = len(text) + text.count(bucket) * (63 - len(bucket))
    assert longest <= 6144, longest


def test_the_claim_function_reads_and_writes_test_plans_and_nothing_else_of_a_job(rendered):
    """A sharded stage's test plan (relevo_core.fleet.test_plans): the claim function records it on
    the job with exactly its attributes, finds the project's earlier jobs, reads listings and
    results documents in the jobs' .relevo-tests/ folders and writes only plans there."""
    from relevo_core.store.test_plans import ATTRIBUTES

    _, renderer, documents = rendered
    claims = [documents["AgentSessionsPolicy"]]
    table, bucket = renderer.get_att("Table", "Arn"), renderer.get_att("ArtifactBucket", "Arn")
    tests = f"{bucket}/{P}/{X}/.relevo-tests"
    allowed = {
        "the plan's record": _dynamodb(table, "PutItem", f"JOB#{X}", *ATTRIBUTES[2:]),
        "the project's jobs by time": Request("dynamodb:Query", f"{table}/index/ProjectJobsIndex"),
        "a listing": Request("s3:GetObject", f"{tests}/test.listing.{'a' * 64}.txt"),
        "an earlier job's results": Request(
            "s3:GetObject", f"{bucket}/{P}/{Y}/.relevo-tests/test.shard-1.2.json"
        ),
        "the plan": Request("s3:PutObject", f"{tests}/test.plan.shard-3.json"),
    }
    refused = {
        "a job record's status": _dynamodb(table, "PutItem", f"JOB#{X}", "status"),
        "a stage record put whole": _dynamodb(table, "PutItem", f"STAGES#{X}", "stage"),
        "the job status index": Request("dynamodb:Query", f"{table}/index/JobStatusIndex"),
        "a listing overwritten": Request("s3:PutObject", f"{tests}/test.listing.{'a' * 64}.txt"),
        "a results document overwritten": Request("s3:PutObject", f"{tests}/test.shard-1.1.json"),
        "a build's file": Request("s3:GetObject", f"{bucket}/{P}/{X}/build/app.ipa"),
        "a handoff": Request("s3:GetObject", f"{bucket}/{P}/{X}/.relevo-handoff/build/manifest.json"),
        "a plan deleted": Request("s3:DeleteObject", f"{tests}/test.plan.shard-3.json"),
    }
    for what, request in allowed.items():
        assert _decide(claims, request) is PolicyDecision.ALLOW, what
    for what, request in refused.items():
        assert _decide(claims, request) is PolicyDecision.NO_MATCH, what


def test_a_job_session_stores_its_own_job_s_listing_and_no_other_job_s(rendered):
    """The shard's listing is stored with its job's session, at the key the route derives: another
    job's session cannot put it there (nor replace a plan), so the route reads what this job listed."""
    _, renderer, documents = rendered
    job, bucket = [documents["JobPolicy"]], renderer.get_att("ArtifactBucket", "Arn")
    listing = f"{P}/{X}/.relevo-tests/test.listing.{'a' * 64}.txt"
    assert _decide(job, Request("s3:PutObject", f"{bucket}/{listing}"), _tags()) is PolicyDecision.ALLOW
    assert (
        _decide(job, Request("s3:PutObject", f"{bucket}/{listing}"), _tags(job=Y)) is PolicyDecision.NO_MATCH
    )
    assert (
        _decide(job, Request("s3:PutObject", f"{bucket}/{listing}"), _tags(job=X, project=Q))
        is PolicyDecision.NO_MATCH
    )


def test_the_claim_function_reads_which_macs_hold_cache_entries_and_nothing_else_of_them(rendered):
    """Placement by cache (relevo_core.fleet.warm_macs): the claim function reads the `holders` of
    a project's cache entries, by a Query projecting them only; a job's restore names its Mac there
    beside its hit, and writes nothing else of an entry."""
    _, renderer, documents = rendered
    claims, job = [documents["AgentSessionsPolicy"]], [documents["JobPolicy"]]
    table = renderer.get_att("Table", "Arn")

    def query(*attributes: str, select: str | None = "SPECIFIC_ATTRIBUTES") -> Request:
        request = _dynamodb(table, "Query", f"CACHE#{P}/eu-west", *attributes)
        return Request(
            request.action, request.resource, context={**request.context, "dynamodb:Select": select}
        )

    # Given the claim function's policy, Then it queries a cache partition's holders only
    assert _decide(claims, query("holders")) is PolicyDecision.ALLOW
    refused = {
        "what an entry holds": query("holders", "manifest_sha256"),
        "every attribute": query(select="ALL_ATTRIBUTES"),
        "a Query with no projection": _dynamodb(table, "Query", f"CACHE#{P}/eu-west"),
        "an entry's record read whole": _dynamodb(table, "GetItem", f"CACHE#{P}/eu-west"),
        "an entry written": _dynamodb(table, "UpdateItem", f"CACHE#{P}/eu-west", "holders"),
        "an entry deleted": _dynamodb(table, "DeleteItem", f"CACHE#{P}/eu-west"),
    }
    for what, request in refused.items():
        assert _decide(claims, request) is PolicyDecision.NO_MATCH, what
    # and a job's session, a pull request's too, names its Mac beside its hit, nothing more
    for tags in (_tags(cache_write=f"{P}/eu-west"), _tags()):
        hit = _dynamodb(table, "UpdateItem", f"CACHE#{P}/eu-west", "last_used_at", "hits", "holders")
        assert _decide(job, hit, tags) is PolicyDecision.ALLOW
        forged = _dynamodb(table, "UpdateItem", f"CACHE#{P}/eu-west", "holders", "size")
        assert _decide(job, forged, tags) is PolicyDecision.NO_MATCH
