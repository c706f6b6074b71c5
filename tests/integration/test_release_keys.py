"""A project's release keys (relevo/<stack>/_release/<project>/…) and the job credentials of a claim,
on the local stack with IAM enforcement on: the session of a stage with a built-in effect reads its
own project's keys and no other project's; a command stage's session reads none (issue 44)."""

from __future__ import annotations

import secrets

import pytest

from tests.helpers.iam import client_as, refusal_code
from tests.helpers.stack import receive_stage
from tests.helpers.state_machine import start_job
from tests.integration.test_agent_role import Dispatched, _routes

pytestmark = pytest.mark.timeout(120)


def _effect_stage(project: str) -> list[dict]:
    # The file is the checkout's (no earlier stage hands it on): the stage that puts it is the first.
    return [
        {
            "name": "publish",
            "effect": {"kind": "s3_object", "file": "App.zip", "bucket": f"dl-{project}", "key": "App.zip"},
        }
    ]


def test_an_effects_session_reads_its_projects_release_key_and_not_another_projects(local_stack):
    # Given projects P and Q, each with a release key; a job of P whose stage has an effect, and a
    # job of Q whose stage is a command
    from relevo_core.aws import client

    suffix = secrets.token_hex(3)
    p, q = f"p-rel-{suffix}", f"q-rel-{suffix}"
    admin = client("secretsmanager")
    p_key, q_key = (
        admin.create_secret(
            Name=f"relevo/{local_stack.stack_name}/_release/{name}/asc.json", SecretString='{"key_id": "K"}'
        )["Name"]
        for name in (p, q)
    )
    checkout = {"url": "https://git.example.com/app.git"}
    p_job = start_job(local_stack, p, _effect_stage(p), checkout=checkout)
    q_job = start_job(local_stack, q, [{"name": "build", "run": "true"}], checkout=checkout)
    routes = _routes(local_stack, "eu-west")

    # When each stage is claimed, its claim answered with the job's session
    sessions = {}
    for name, job_id in (("p", p_job), ("q", q_job)):
        task = receive_stage(local_stack, job_id)[0]
        granted = routes.claim(Dispatched(job_id, name, task).claim(local_stack, f"mac-{suffix}-{name}"))
        session = granted.session
        sessions[name] = client_as(
            local_stack,
            "secretsmanager",
            session.access_key_id,
            session.secret_access_key,
            session.session_token,
        )

    # Then P's effect session reads P's key, and is refused Q's
    assert sessions["p"].get_secret_value(SecretId=p_key)["SecretString"] == '{"key_id": "K"}'
    assert refusal_code(lambda: sessions["p"].get_secret_value(SecretId=q_key)) == "AccessDeniedException"
    # And Q's command session reads no release key, not even its own project's
    assert refusal_code(lambda: sessions["q"].get_secret_value(SecretId=q_key)) == "AccessDeniedException"
