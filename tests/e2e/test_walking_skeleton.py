"""The walking skeleton on the real thing: `relevo local up` as a process, a real relevo-agent
process, a signed GitHub push, the job followed through the API to `succeeded`."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest
import requests

from relevo_cli.api import RelevoApi
from relevo_cli.projects import apply_project_file
from relevo_core.intake.webhooks.github import sign
from relevo_local.processes import agent_process, local_stack, write_agent_config
from relevo_local.template import load_sam_template
from tests.helpers import ROOT
from tests.helpers.payloads import push_body
from tests.helpers.stack import use_stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_signed_push_runs_both_stages_on_a_real_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    state_dir = tmp_path / "state"
    with local_stack(state_dir, tmp_path / "local-up.log") as stack:
        # Given the stack that `relevo local up` wrote to its state dir
        use_stack(monkeypatch, stack)
        template_ids = set(load_sam_template(ROOT / "template.yaml")["Resources"])
        assert template_ids <= set(stack.resources), (
            f"missing from stack.json: {template_ids - set(stack.resources)}"
        )
        assert set(stack.work_queues) == {"eu-west", "us-east"}
        assert [i for i in template_ids if i not in stack.not_emulated and not stack.resources[i]] == []

        # and a project registered with `relevo project apply`'s code path
        project_file = tmp_path / "project.yaml"
        project_file.write_text(
            (ROOT / "examples" / "demo-app.yaml")
            .read_text()
            .replace("id: demo-app", "id: e2e-app")
            .replace("acme/demo-app", "acme/e2e-app")
        )
        webhook_secret = secrets.token_urlsafe(16)
        monkeypatch.setenv("RELEVO_DEMO_WEBHOOK_SECRET", webhook_secret)
        api = RelevoApi.for_stack(stack)
        apply_project_file(stack, api, project_file)
        config = write_agent_config(tmp_path / "agent.toml", state_dir / "stack.json", "eu-west", "e2e-mac")

        with agent_process(config, tmp_path / "agent.log"):
            # When GitHub delivers a signed push
            commit = secrets.token_hex(20)
            body = push_body("acme/e2e-app", commit)
            response = requests.post(
                f"{stack.api_url}/webhooks/github/e2e-app",
                data=body,
                headers={"X-GitHub-Event": "push", "X-Hub-Signature-256": sign(webhook_secret, body)},
                timeout=60,
            )
            assert response.status_code == 202, response.text
            job_id = response.json()["job_id"]

            # Then the agent runs both stages and the job succeeds
            deadline = time.monotonic() + 120
            job = api.get_job(job_id)
            while job["status"] not in ("succeeded", "failed", "canceled") and time.monotonic() < deadline:
                time.sleep(0.3)
                job = api.get_job(job_id)

    assert job["status"] == "succeeded", (job, (tmp_path / "agent.log").read_text()[-3000:])
    assert [(s["name"], s["status"], s["agent_id"]) for s in job["stages"]] == [
        ("build", "succeeded", "e2e-mac"),
        ("sign", "succeeded", "e2e-mac"),
    ]
    assert job["commit"] == commit
    assert job["last_successful_stage"] == "sign"
    artifact = (
        tmp_path / "e2e-mac-workspaces" / "e2e-app" / ".relevo-artifacts" / job_id / "build" / "build.txt"
    )
    assert artifact.read_text().strip() == "build-ok"
    assert not (state_dir / "stack.json").exists(), "local up removes its stack.json when stopped"
