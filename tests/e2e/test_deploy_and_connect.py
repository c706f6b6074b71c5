"""docs/operations.md "Deploy to AWS" → "Connect a Mac", run as written against the local stack (created
through the emulator's CloudFormation, as `sam deploy` creates the real one):

- the operator's CLI finds the stack by name only (`relevo stack use`), never local up's stack.json;
- a Mac is an IAM user allowed nothing but to take its region's agent role, whose key comes
  through `credential_process` (the keychain on a Mac, a file here);
- `relevo-agent init` writes the agent's config from the stack and its doctor passes;
- the agent runs a whole job with the agent role's powers only, under IAM enforcement.

Every command this test runs appears in that deploy sequence (checked below), so the two
cannot drift apart; only `sam deploy` itself is not run here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from relevo_local.processes import local_stack
from tests.helpers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# The deploy sequence's commands (docs/operations.md), as this test runs them (placeholders in braces).
README_COMMANDS = [
    "relevo aws preflight --region {region}",
    "relevo stack use {stack} --region {region}",
    "relevo stack show",
    "relevo-agent init --stack {stack} --region-affinity eu-west --profile relevo-agent",
    "relevo project apply {project_file}",
    "relevo project run {project} --ref main",
]


def _clean_env(**extra: str) -> dict[str, str]:
    """A user's environment: no AWS variables of the test process, no stack file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("RELEVO_")}
    return {**env, **extra}


def _run(
    args: list[str], env: dict[str, str], endpoint: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    program, *rest = args
    module = {"relevo": "relevo_cli.main", "relevo-agent": "relevo_agent.cli"}[program]
    # --endpoint-url (where AWS is, here the emulator) is the one thing a real deploy does not pass.
    if rest[:1] in (["stack"], ["aws"]) and rest[1:2] in (["use"], ["preflight"]) or rest[:1] == ["init"]:
        rest = [*rest, "--endpoint-url", endpoint]
    done = subprocess.run(
        [sys.executable, "-m", module, *rest], env=env, capture_output=True, text=True, timeout=120
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def test_the_readme_deploy_sequence_connects_the_cli_and_a_mac_and_runs_a_job(tmp_path: Path):
    readme = (ROOT / "docs" / "operations.md").read_text()
    for command in README_COMMANDS:
        pattern = (
            re.escape(command)
            .replace(r"\{region\}", r"\S+")
            .replace(r"\{stack\}", r"\S+")
            .replace(r"\{project_file\}", r"\S+")
            .replace(r"\{project\}", r"\S+")
        )
        assert re.search(pattern, readme), f"docs/operations.md's deploy sequence lacks: {command}"

    state = tmp_path / "state"
    with local_stack(state, tmp_path / "local-up.log") as stack:
        # The operator's own AWS credentials (here the emulator's IAM user; the CLI reads nothing else from
        # local up).
        operator_home = tmp_path / "operator"
        operator_home.mkdir()
        assert stack.local_credentials is not None
        (operator_home / "credentials").write_text(
            f"[default]\naws_access_key_id = {stack.local_credentials.access_key_id}\n"
            f"aws_secret_access_key = {stack.local_credentials.secret_access_key}\n"
        )
        (operator_home / "config").write_text(f"[default]\nregion = {stack.region}\n")
        operator = _clean_env(
            AWS_SHARED_CREDENTIALS_FILE=str(operator_home / "credentials"),
            AWS_CONFIG_FILE=str(operator_home / "config"),
            RELEVO_USER_STACK_FILE=str(operator_home / "relevo-stack.json"),
            RELEVO_DEMO_WEBHOOK_SECRET="e2e-secret",
        )
        endpoint = str(stack.aws_endpoint)
        preflight = _run(
            ["relevo", "aws", "preflight", "--region", stack.region], operator, endpoint, check=False
        )
        assert "stack: relevo exists" in preflight.stdout, preflight.stdout
        _run(["relevo", "stack", "use", stack.stack_name, "--region", stack.region], operator, endpoint)
        shown = _run(["relevo", "stack", "show"], operator, endpoint)
        assert "relevo stack use" in shown.stdout and "ok    api" in shown.stdout, shown.stdout

        # A Mac: an IAM user that may only take the eu-west agent role (README's aws iam commands).
        outputs = {
            o["OutputKey"]: o["OutputValue"]
            for o in boto3.client(
                "cloudformation",
                endpoint_url=endpoint,
                region_name=stack.region,
                aws_access_key_id=stack.local_credentials.access_key_id,
                aws_secret_access_key=stack.local_credentials.secret_access_key,
            ).describe_stacks(StackName=stack.stack_name)["Stacks"][0]["Outputs"]
        }
        role = outputs["AgentRoleArneuwest"]
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name=stack.region,
            aws_access_key_id=stack.local_credentials.access_key_id,
            aws_secret_access_key=stack.local_credentials.secret_access_key,
        )
        iam.create_user(UserName="relevo-mac-1")
        iam.put_user_policy(
            UserName="relevo-mac-1",
            PolicyName="take-agent-role",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": role}],
                }
            ),
        )
        key = iam.create_access_key(UserName="relevo-mac-1")["AccessKey"]
        mac = tmp_path / "mac"
        (mac / ".aws").mkdir(parents=True)
        # The keychain item's JSON (credential_process answers with it); `security find-generic-password -w`
        # on a Mac.
        keychain = mac / "keychain-item.json"
        keychain.write_text(
            json.dumps(
                {"Version": 1, "AccessKeyId": key["AccessKeyId"], "SecretAccessKey": key["SecretAccessKey"]}
            )
        )
        keychain.chmod(0o600)
        (mac / ".aws" / "config").write_text(
            f"[profile relevo-mac-key]\ncredential_process = /bin/cat {keychain}\n\n"
            f"[profile relevo-agent]\nrole_arn = {role}\nsource_profile = relevo-mac-key\nregion = "
            f"{stack.region}\n"
        )
        # AWS_ENDPOINT_URL: where "AWS" is for every client, the role-taking STS call included.
        mac_env = _clean_env(
            AWS_CONFIG_FILE=str(mac / ".aws" / "config"),
            AWS_SHARED_CREDENTIALS_FILE=str(mac / ".aws" / "credentials"),
            HOME=str(mac),
            AWS_ENDPOINT_URL=endpoint,
        )
        config = mac / "relevo" / "agent.toml"
        init = _run(
            [
                "relevo-agent",
                "init",
                "--stack",
                stack.stack_name,
                "--region-affinity",
                "eu-west",
                "--profile",
                "relevo-agent",
                "--config",
                str(config),
                "--agent-id",
                "mac-1",
                "--region",
                stack.region,
            ],
            mac_env,
            endpoint,
        )
        assert "all checks passed" in init.stdout, init.stdout
        assert "they are the agent role of eu-west" in init.stdout, init.stdout

        agent_log = tmp_path / "mac-1.log"
        with open(agent_log, "wb") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "relevo_agent.launch", "--config", str(config)],
                env=mac_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            project_file = tmp_path / "project.yaml"
            project_file.write_text(
                (ROOT / "examples" / "demo-app.yaml").read_text().replace("id: demo-app", "id: connect-app")
            )
            _run(["relevo", "project", "apply", str(project_file)], operator, endpoint)
            ran = _run(["relevo", "run", "connect-app", "--ref", "main"], operator, endpoint)
            job_id = re.search(r"job_[0-9a-z]+", ran.stdout).group(0)
            deadline, job = time.monotonic() + 120, {}
            while time.monotonic() < deadline:
                job = json.loads(_run(["relevo", "status", job_id, "--json"], operator, endpoint).stdout)
                if job["status"] in ("succeeded", "failed", "canceled"):
                    break
                time.sleep(1)
        finally:
            agent.terminate()
            agent.wait(timeout=30)
        log_text = agent_log.read_text()
        assert job.get("status") == "succeeded", (job, log_text[-3000:])
        assert {stage["agent_id"] for stage in job["stages"]} == {"mac-1"}
        assert "AccessDenied" not in log_text and "not authorized" not in log_text, log_text[-3000:]
