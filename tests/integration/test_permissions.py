"""Permissions: every IAM route, called by IAM users at each level (view < operate < manage), with
no grant, and as an admin principal, through the local API Gateway (SigV4 signatures verified,
identity resolved by the emulator's STS). A denied call is 403 FORBIDDEN and writes nothing."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from relevo_cli.api import RelevoApi
from relevo_core.aws import client
from relevo_local.identity import local_user_arn
from tests.helpers import TEST_ADMIN_ARN
from tests.helpers.iam import ACCOUNT, INVOKE_API, Caller, api_as, iam_user
from tests.helpers.stack import receive_stage, wait_for_execution
from tests.helpers.state_machine import agent_runs

LEVELS = ["none", "view", "operate", "manage"]
RANK = {level: rank for rank, level in enumerate(LEVELS)}
DECLARATION = {
    "repo": "acme/perm",
    "region_affinity": "eu-west",
    "lease_ttl_sec": 10,
    "queue_timeout_sec": 30,
    "stages": [{"name": "build", "run": "make"}],
}


def _snapshot(stack, project_id: str) -> dict[tuple[str, str], Any]:
    """Every item of the project: its own partition (declaration, grants), its lock, its dedup
    records, and every item of each of its jobs (envelope, stages, audit, dead-letter entry). A job
    written by a trigger is in here with its dedup record; the global queued-jobs counter moves only
    in the same transaction, so it is left out (other tests' leftover jobs may move it)."""
    dynamodb = client("dynamodb")
    kwargs: dict[str, Any] = {
        "TableName": stack.table_name,
        "ConsistentRead": True,
        # Server-side filter: only the project's items travel (a scan: tests only).
        "FilterExpression": "#project = :p OR begins_with(pk, :partition) OR begins_with(pk, :dedup) OR pk "
        "= :lock",
        "ExpressionAttributeNames": {"#project": "project"},
        "ExpressionAttributeValues": {
            ":p": {"S": project_id},
            ":partition": {"S": f"PROJECT#{project_id}"},
            ":dedup": {"S": f"DEDUP#{project_id}:"},
            ":lock": {"S": f"LOCK#{project_id}"},
        },
    }
    items = []
    while True:
        page = dynamodb.scan(**kwargs)
        items.extend(page["Items"])
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    # Stage and audit items do not name the project: read each job's partitions.
    job_ids = {i["pk"]["S"][4:] for i in items if i["pk"]["S"].startswith("JOB#")}
    for job_id in sorted(job_ids):
        for prefix in ("JOB", "AUDIT", "DLQ"):
            page = dynamodb.query(
                TableName=stack.table_name,
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": {"S": f"{prefix}#{job_id}"}},
                ConsistentRead=True,
            )
            items.extend(page["Items"])
    return {(i["pk"]["S"], i["sk"]["S"]): i for i in items}


@pytest.fixture(scope="module")
def world(local_stack):
    """Project A with one dead-lettered job D; IAM users at each level; an admin. A's region is
    then moved to one without a work queue, so an allowed run or rerun is refused (422
    REGION_UNKNOWN) after the permission check and before anything is written: the matrix leaves
    no job in flight to disturb the before/after snapshots."""
    suffix = secrets.token_hex(3)
    project_id = f"perm-{suffix}"
    owner = Caller(
        local_user_arn(), RelevoApi.for_stack(local_stack)
    )  # the stack's own IAM user: A's creator
    users = {level: iam_user(local_stack, f"perm-{level}-{suffix}") for level in LEVELS}
    admin = iam_user(local_stack, TEST_ADMIN_ARN.rsplit("/", 1)[1])
    owner.api.put_project(project_id, DECLARATION)
    for level in ("view", "operate", "manage"):
        owner.api.grant(project_id, users[level].arn, level)

    job_id = owner.api.run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(local_stack, job_id)
    agent_runs(local_stack, task, succeed=False, error="Relevo.Fatal.ProfileMismatch")
    assert wait_for_execution(local_stack, job_id)["status"] == "FAILED"
    assert owner.api.dead_letter(job_id)["state"] == "open"
    # An ended job for the one allowed DELETE of the matrix (it removes its target).
    doomed = owner.api.run_project(project_id, {"ref": "main", "request_id": "doomed"})["job_id"]
    agent_runs(local_stack, receive_stage(local_stack, doomed)[0])
    assert wait_for_execution(local_stack, doomed)["status"] == "SUCCEEDED"
    owner.api.put_project(project_id, {**DECLARATION, "region_affinity": "nowhere"})
    return {
        "project": project_id,
        "job": job_id,
        "doomed": doomed,
        "owner": owner,
        "users": users,
        "admin": admin,
    }


def _routes(project_id: str, job_id: str, doomed: str) -> list[tuple[str, str, Any, str]]:
    """(method, path, body, level needed): every IAM route of the API. Redrive comes last: an
    allowed one starts a job. The allowed DELETE removes `doomed` (ended), not `job_id`."""
    return [
        ("GET", f"/projects/{project_id}", None, "view"),
        ("GET", f"/projects/{project_id}/grants", None, "view"),
        ("GET", f"/jobs/{job_id}", None, "view"),
        ("GET", f"/jobs/{job_id}/cost", None, "view"),
        ("GET", f"/dlq/{job_id}", None, "view"),
        ("GET", f"/jobs/{job_id}/logs?from_seq=0&limit=5", None, "view"),
        ("GET", f"/jobs/{job_id}/artifacts/app.ipa", None, "view"),
        ("GET", f"/jobs/{job_id}/tests?status=failed&limit=5", None, "view"),
        ("POST", f"/projects/{project_id}/run", {"ref": "main"}, "operate"),
        ("POST", f"/jobs/{job_id}/release", {}, "operate"),
        ("POST", f"/jobs/{job_id}/approve", {}, "operate"),
        ("POST", f"/jobs/{job_id}/reject", {"reason": "no"}, "operate"),
        ("PUT", f"/projects/{project_id}", {**DECLARATION, "region_affinity": "nowhere"}, "manage"),
        (
            "PUT",
            f"/projects/{project_id}/grants",
            {"principal": f"arn:aws:iam::{ACCOUNT}:user/bystander", "level": "view"},
            "manage",
        ),
        ("POST", f"/jobs/{job_id}/cancel", {}, "manage"),
        ("POST", f"/jobs/{job_id}/rerun", {}, "manage"),
        ("POST", f"/jobs/{job_id}/promote", {}, "manage"),
        ("POST", f"/jobs/{job_id}/priority", {"priority": 7}, "manage"),
        ("DELETE", f"/jobs/{doomed}", None, "manage"),
        ("POST", f"/dlq/{job_id}/redrive", {}, "manage"),
    ]


@pytest.mark.timeout(600)  # about 70 signed calls and 35 snapshots on a stack shared with other tests
def test_every_route_allows_exactly_the_levels_it_needs_and_a_denied_call_writes_nothing(local_stack, world):
    project_id, job_id, users = world["project"], world["job"], world["users"]
    cells = []
    for method, path, body, needed in _routes(project_id, job_id, world["doomed"]):
        denied = [level for level in LEVELS if RANK[level] < RANK[needed]]
        allowed = [level for level in LEVELS if RANK[level] >= RANK[needed]]
        # The denied callers first, all between two snapshots (no allowed call in between).
        before = _snapshot(local_stack, project_id)
        for level in denied:
            status, answer = users[level].call(method, path, body)
            cells.append(
                f"{method} {path.replace(project_id, '{p}').replace(job_id, '{j}')} as {level}: {status}"
            )
            assert (status, answer["error"]) == (403, "FORBIDDEN"), (method, path, level, answer)
        assert _snapshot(local_stack, project_id) == before, (
            f"a denied {method} {path} ({denied}) wrote to the table"
        )
        for level in allowed:
            status, answer = users[level].call(method, path, body)
            cells.append(
                f"{method} {path.replace(project_id, '{p}').replace(job_id, '{j}')} as {level}: {status}"
            )
            assert status != 403, (method, path, level, answer)
            if path.endswith("/redrive") and status == 200:
                world["owner"].api.cancel_job(answer["job_id"])  # leave no job in flight
    # The allowed DELETE removed its ended job (an admin learns it is gone).
    assert world["admin"].call("GET", f"/jobs/{world['doomed']}")[1]["error"] == "JOB_NOT_FOUND"
    # Callers with view learn why they are refused; callers without it learn nothing more.
    assert users["view"].call("POST", f"/jobs/{job_id}/cancel", {})[1]["details"] == {
        "required": "manage",
        "level": "view",
    }
    print("\n".join(cells))


def test_the_admin_principal_manages_every_project(world):
    status, answer = world["admin"].call(
        "PUT",
        f"/projects/{world['project']}/grants",
        {"principal": world["users"]["none"].arn, "level": "view"},
    )
    assert status == 200 and answer["level"] == "view"
    assert world["users"]["none"].call("GET", f"/projects/{world['project']}")[0] == 200
    assert (
        world["admin"].call(
            "PUT",
            f"/projects/{world['project']}/grants",
            {"principal": world["users"]["none"].arn, "level": "none"},
        )[0]
        == 200
    )
    assert world["users"]["none"].call("GET", f"/projects/{world['project']}")[0] == 403


def test_a_missing_target_looks_the_same_as_one_the_caller_may_not_view(world):
    """403 with the same body whether or not it exists, unless the caller could view it: then 404."""
    missing_job, missing_project = "job_" + "0" * 26, f"nope-{secrets.token_hex(3)}"
    stranger, manager, admin = world["users"]["none"], world["users"]["manage"], world["admin"]

    def refusal(caller: Caller, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return caller.call(method, path, body)

    for path, body, method in [
        ("/jobs/{}", None, "GET"),
        ("/jobs/{}/cancel", {}, "POST"),
        ("/dlq/{}", None, "GET"),
        ("/jobs/{}", None, "DELETE"),
        ("/jobs/{}/promote", {}, "POST"),
        ("/jobs/{}/logs", None, "GET"),
        ("/jobs/{}/artifacts/app.ipa", None, "GET"),
        ("/jobs/{}/tests", None, "GET"),
    ]:
        hidden = refusal(stranger, method, path.format(world["job"]), body)
        absent = refusal(stranger, method, path.format(missing_job), body)
        assert hidden[0] == absent[0] == 403
        assert hidden[1]["message"].replace(world["job"], "ID") == absent[1]["message"].replace(
            missing_job, "ID"
        )
        assert refusal(manager, method, path.format(missing_job), body)[0] == 403
    assert refusal(admin, "GET", f"/jobs/{missing_job}")[1]["error"] == "JOB_NOT_FOUND"
    assert refusal(admin, "GET", f"/dlq/{missing_job}")[1]["error"] == "DLQ_ENTRY_NOT_FOUND"

    hidden = refusal(stranger, "GET", f"/projects/{world['project']}")
    absent = refusal(stranger, "GET", f"/projects/{missing_project}")
    assert (hidden[0], absent[0]) == (403, 403)
    assert hidden[1]["message"].replace(world["project"], "ID") == absent[1]["message"].replace(
        missing_project, "ID"
    )
    assert refusal(admin, "GET", f"/projects/{missing_project}")[1]["error"] == "PROJECT_NOT_FOUND"


def test_listings_show_only_what_the_caller_may_view(world):
    project_id, job_id = world["project"], world["job"]
    for caller, sees in [
        (world["users"]["none"], False),
        (world["users"]["view"], True),
        (world["users"]["manage"], True),
        (world["admin"], True),
        (world["owner"], True),
    ]:
        projects = caller.api.list_projects()
        entries = caller.api.dead_letters()
        jobs = caller.call("GET", f"/jobs?project={project_id}")[1]
        queue = caller.call("GET", "/queue")[1]
        assert projects["count"] == len(projects["projects"]) and entries["count"] == len(entries["entries"])
        assert jobs["count"] == len(jobs["jobs"]) and queue["count"] == len(queue["jobs"])
        assert (project_id in {p["id"] for p in projects["projects"]}) is sees, caller.arn
        assert (job_id in {e["job_id"] for e in entries["entries"]}) is sees, caller.arn
        assert (job_id in {j["job_id"] for j in jobs["jobs"]}) is sees, caller.arn
        if not caller.arn == TEST_ADMIN_ARN:
            # Everything listed is something a grant (or being its creator) lets the caller view.
            for project in projects["projects"]:
                assert caller.call("GET", f"/projects/{project['id']}")[0] == 200
            for job in queue["jobs"]:
                assert caller.call("GET", f"/jobs/{job['job_id']}")[0] == 200


def test_a_project_is_created_by_anyone_and_then_changed_only_by_its_managers(local_stack, world):
    project_id = f"perm-new-{secrets.token_hex(3)}"
    creator, other = world["users"]["none"], world["users"]["view"]

    assert creator.call("PUT", f"/projects/{project_id}", DECLARATION)[0] == 200
    grants = creator.api.grants(project_id)["grants"]
    before = _snapshot(local_stack, project_id)
    status, answer = other.call("PUT", f"/projects/{project_id}", {**DECLARATION, "repo": "evil/fork"})

    assert {(g["principal"], g["level"]) for g in grants if not g.get("admin")} == {(creator.arn, "manage")}
    assert (status, answer["error"]) == (403, "FORBIDDEN")
    assert _snapshot(local_stack, project_id) == before
    assert (
        creator.call("PUT", f"/projects/{project_id}/grants", {"principal": other.arn, "level": "manage"})[0]
        == 200
    )
    assert other.call("PUT", f"/projects/{project_id}", {**DECLARATION, "repo": "acme/moved"})[0] == 200


def test_a_wildcard_grant_covers_every_session_of_a_role_and_nothing_else(local_stack, world):
    suffix = secrets.token_hex(3)
    project_id = f"perm-bot-{suffix}"
    owner = world["owner"]
    owner.api.put_project(project_id, {**DECLARATION, "region_affinity": "nowhere"})
    iam, sts = client("iam"), client("sts")
    trust = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
                    "Action": "sts:AssumeRole",
                }
            ],
        }
    )
    sessions = {}
    for role in (f"ReleaseBot{suffix}", f"OtherBot{suffix}"):
        arn = iam.create_role(RoleName=role, AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        iam.put_role_policy(RoleName=role, PolicyName="invoke-relevo-api", PolicyDocument=INVOKE_API)
        for session in ("deploy-1", "deploy-2"):
            credentials = sts.assume_role(RoleArn=arn, RoleSessionName=session)["Credentials"]
            api = api_as(
                local_stack,
                {
                    "aws_access_key_id": credentials["AccessKeyId"],
                    "aws_secret_access_key": credentials["SecretAccessKey"],
                    "aws_session_token": credentials["SessionToken"],
                },
            )
            sessions[(role, session)] = Caller(f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/{session}", api)
    owner.api.grant(project_id, f"arn:aws:sts::{ACCOUNT}:assumed-role/ReleaseBot{suffix}/*", "operate")

    for (role, session), caller in sessions.items():
        run = caller.call("POST", f"/projects/{project_id}/run", {"ref": "main"})
        manage = caller.call(
            "PUT", f"/projects/{project_id}/grants", {"principal": caller.arn, "level": "manage"}
        )
        if role.startswith("ReleaseBot"):
            # Allowed: refused only afterwards, for the region without a work queue.
            assert (run[0], run[1]["error"]) == (422, "REGION_UNKNOWN"), session
            assert (manage[0], manage[1]["error"]) == (403, "FORBIDDEN"), session
        else:
            assert (run[0], run[1]["error"]) == (403, "FORBIDDEN"), session
    listed = {
        (role, s): project_id in {p["id"] for p in c.api.list_projects()["projects"]}
        for (role, s), c in sessions.items()
    }
    assert listed == {key: key[0].startswith("ReleaseBot") for key in sessions}

    # A grant to the role's ARN names its sessions too (they never call as the role itself).
    owner.api.grant(project_id, f"arn:aws:iam::{ACCOUNT}:role/OtherBot{suffix}", "view")
    assert sessions[(f"OtherBot{suffix}", "deploy-2")].call("GET", f"/projects/{project_id}")[0] == 200


def test_only_a_verified_signature_names_the_caller(local_stack, world):
    """The local API Gateway checks each SigV4 signature against the secret of the key it names,
    as API Gateway does; a key id alone (they are not secret) names no one."""
    viewer = world["users"]["view"]
    frozen = viewer.api.session.get_credentials().get_frozen_credentials()
    url = f"{local_stack.api_url}/projects/{world['project']}"

    def signed_get(credentials: Credentials, **headers: str) -> requests.Response:
        request = AWSRequest(method="GET", url=url, headers=headers)
        SigV4Auth(credentials, "execute-api", local_stack.region).add_auth(request)
        return requests.get(url, headers=dict(request.headers), timeout=30)

    assert signed_get(Credentials(frozen.access_key, frozen.secret_key)).status_code == 200
    forged = signed_get(Credentials(frozen.access_key, "not-the-secret"))
    unknown = signed_get(Credentials("AKIA" + "Z" * 16, "whatever"))
    # A header the client chooses does not name the caller either: the key that signed does.
    stranger = world["users"]["none"].api.session.get_credentials().get_frozen_credentials()
    claimed = signed_get(
        Credentials(stranger.access_key, stranger.secret_key), **{"X-Amz-User-Arn": TEST_ADMIN_ARN}
    )

    assert (forged.status_code, forged.json()["message"].split(".")[0]) == (
        403,
        "The request signature we calculated does not match the signature you provided",
    )
    assert (unknown.status_code, unknown.json()) == (
        403,
        {"error": "UNAUTHENTICATED", "message": "The security token included in the request is invalid."},
    )
    assert forged.json()["error"] == "UNAUTHENTICATED"
    assert (claimed.status_code, claimed.json()["error"]) == (403, "FORBIDDEN")
    assert claimed.json()["message"].startswith(world["users"]["none"].arn)
