"""A stage never sees the agent's credentials: the real agent runs a stage that prints its whole
environment, on the local stack, while the agent itself holds keys, a session token, a profile,
credential files and a stack file; the stage's log holds none of them. A stage that names an
`aws_profile` gets that profile, of the build user's own AWS configuration; one that needs the
job's build number gets RELEVO_BUILD_NUMBER."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from relevo_agent.stage_env import stage_environment
from relevo_core.store import log_reads
from relevo_local.processes import agent_process, write_agent_config
from tests.helpers.payloads import push_body
from tests.helpers.stack import deliver, register_project, wait_for_execution

PRINT_ENV = "env | sort"


def _stage_logs(stack, job_id: str) -> dict[str, str]:
    logs: dict[str, str] = {}
    from_seq = 0
    while from_seq is not None:
        page = log_reads.read_chunks(stack.table_name, job_id, from_seq=from_seq, limit=50)
        for chunk in page.chunks:
            logs[chunk.stage] = logs.get(chunk.stage, "") + chunk.data
        from_seq = page.next_seq
    return logs


@pytest.mark.timeout(180)
def test_a_stage_prints_its_environment_and_no_agent_credential_is_in_it(
    local_stack, project_id, tmp_path: Path
):
    # Given a relevo-agent process whose environment carries every way to find its credentials.
    # (A process of its own: setting these in the test's process would reach the emulator too.)
    credentials_file = tmp_path / "credentials"
    credentials_file.write_text("[default]\naws_access_key_id = AKIAFROMTHEFILE\n")
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(local_stack.model_dump_json())
    config_file = tmp_path / "config"
    config_file.write_text("[profile relevo-agent]\nregion = us-east-1\n")
    agent_key, agent_secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    agent_environment = {
        "AWS_SESSION_TOKEN": "SESSIONTOKENOFTHEAGENT",
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials_file),
        "AWS_CONFIG_FILE": str(config_file),
        "AWS_PROFILE": "relevo-agent",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://127.0.0.1:9/creds",
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "token"),
        "RELEVO_STACK_FILE": str(stack_file),
    }
    secret = register_project(
        local_stack,
        project_id,
        [
            {"name": "build", "run": PRINT_ENV},
            {"name": "upload", "run": PRINT_ENV, "aws_profile": "ios-upload"},
        ],
        # Only upload needs the job's build number: it is given when upload is claimed.
        build_number={"stages": ["upload"], "floor": 41},
    )
    config = write_agent_config(
        tmp_path / "agent.toml", stack_file, "eu-west", f"mac-env-{secrets.token_hex(3)}", poll_wait_sec=1
    )

    # When that agent runs both stages of a job
    with agent_process(config, tmp_path / "agent.log", env=agent_environment):
        job_id = deliver(
            local_stack, project_id, push_body(f"acme/{project_id}", secrets.token_hex(20)), secret
        ).json()["job_id"]
        execution = wait_for_execution(local_stack, job_id, timeout=120)
    assert execution["status"] == "SUCCEEDED", (tmp_path / "agent.log").read_text()[-3000:]

    # Then neither stage's environment names the agent's keys, profile, files or stack file
    logs = _stage_logs(local_stack, job_id)
    log = "".join(logs.values())
    assert all(
        "RELEVO_JOB_ID=" + job_id in logs[stage] for stage in ("build", "upload")
    )  # each printed its environment
    for leaked in (
        agent_key,
        agent_secret,
        "SESSIONTOKENOFTHEAGENT",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SHARED_CREDENTIALS_FILE",
        str(credentials_file),
        "AWS_CONFIG_FILE",
        str(config_file),
        "AWS_CONTAINER_CREDENTIALS",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ENDPOINT_URL",
        "RELEVO_STACK_FILE",
        str(stack_file),
        "relevo-agent",
    ):
        assert leaked not in log, leaked
    # and only the stage that names a profile has one: the project's, not the agent's
    assert "AWS_PROFILE=" not in logs["build"]
    assert "AWS_PROFILE=ios-upload" in logs["upload"].splitlines()
    # and the job's build number (the project's first, at its floor) is in the environment of the
    # stage that needs it, not of the stage before, which ran before the job had one
    assert "RELEVO_BUILD_NUMBER=41" in logs["upload"].splitlines()
    assert "RELEVO_BUILD_NUMBER" not in logs["build"]


def test_only_region_variables_of_the_agent_reach_the_stage():
    parent = {
        "AWS_REGION": "eu-west-1",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "aws_secret_access_key": "lower",
        "AWS_SECURITY_TOKEN": "t",
        "AWS_CONFIG_FILE": "/x",
        "AWS_ROLE_ARN": "arn",
        "AWS_CA_BUNDLE": "/ca",
        "PATH": "/bin",
        "HOME": "/Users/build",
    }
    env = stage_environment(parent, {"RELEVO_STAGE": "build"}, None)
    assert env == {
        "AWS_REGION": "eu-west-1",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "PATH": "/bin",
        "HOME": "/Users/build",
        "RELEVO_STAGE": "build",
    }
