"""`make demo`: the walking skeleton on the embedded local stack.

Starts `relevo local up`, registers a two-stage project, starts one agent, sends a correctly
signed GitHub push webhook, follows the job to `succeeded`, then stops everything it started.
Exits non-zero with the reason if any step fails.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

import requests
from rich.console import Console

from relevo_cli.api import RelevoApi
from relevo_cli.localrun import agent_process, local_stack, random_commit, write_agent_config
from relevo_cli.main import render_job
from relevo_cli.projects import apply_project_file
from relevo_core.webhooks.github import sign

ROOT = Path(__file__).resolve().parents[2]
console = Console()


def push_payload(repo: str, ref: str, commit: str) -> bytes:
    return json.dumps(
        {
            "ref": ref,
            "before": "0" * 40,
            "after": commit,
            "created": True,
            "deleted": False,
            "forced": False,
            "repository": {"full_name": repo, "name": repo.split("/")[-1], "default_branch": "main"},
            "pusher": {"name": "release-bot"},
            "head_commit": {"id": commit, "message": "Release 1.4.0"},
        }
    ).encode()


def follow(api: RelevoApi, job_id: str, timeout: float) -> dict:
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        job = api.get_job(job_id)
        for stage in job["stages"]:
            if seen.get(stage["name"]) != stage["status"]:
                seen[stage["name"]] = stage["status"]
                agent = f" on {stage['agent_id']}" if stage.get("agent_id") else ""
                console.print(f"  stage [bold]{stage['name']}[/bold] → {stage['status']}{agent}")
        if job["status"] in ("succeeded", "failed", "canceled"):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {job['status']} after {timeout:.0f}s")
        time.sleep(0.3)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="relevo-demo-"))
    state_dir = ROOT / ".relevo" / f"demo-{os.getpid()}"
    console.print(f"[bold]Relevo demo[/bold] (logs in {work})")
    try:
        console.print("• starting the local stack (moto + template.yaml + statemachines/job.asl.json)…")
        with local_stack(state_dir, work / "local-up.log") as stack:
            stack.apply_to_environment()
            console.print(f"  API {stack.api_url}, {len(stack.resources)} resources, work queues: {', '.join(stack.work_queues)}")
            api = RelevoApi.for_stack(stack)

            webhook_secret = secrets.token_urlsafe(24)
            os.environ["RELEVO_DEMO_WEBHOOK_SECRET"] = webhook_secret
            project = apply_project_file(stack, api, ROOT / "examples" / "demo-app.yaml")
            console.print(f"• registered project [bold]{project['id']}[/bold]: {' → '.join(s['name'] for s in project['stages'])}")

            config = write_agent_config(work / "agent.toml", state_dir / "stack.json", project["region_affinity"], "mac-mini-eu-1")
            with agent_process(config, work / "agent.log"):
                console.print(f"• started relevo-agent mac-mini-eu-1 ({project['region_affinity']})")
                commit = random_commit()
                body = push_payload(project["repo"], "refs/heads/main", commit)
                headers = {
                    "Content-Type": "application/json",
                    "X-GitHub-Event": "push",
                    "X-GitHub-Delivery": secrets.token_hex(16),
                    "X-Hub-Signature-256": sign(webhook_secret, body),
                }
                url = f"{stack.api_url}/webhooks/github/{project['id']}"
                response = requests.post(url, data=body, headers=headers, timeout=30)
                if response.status_code != 202:
                    raise RuntimeError(f"webhook answered {response.status_code}: {response.text}")
                job_id = response.json()["job_id"]
                console.print(f"• signed push webhook for {commit[:12]} → 202, job [bold]{job_id}[/bold]")
                # GitHub retries a delivery it thinks failed: the same delivery is not a second job.
                again = requests.post(url, data=body, headers=headers, timeout=30)
                if again.status_code != 200 or again.json().get("job_id") != job_id:
                    raise RuntimeError(f"redelivery answered {again.status_code}: {again.text}")
                console.print(f"• the same delivery again → {again.status_code} {again.json()}")
                job = follow(api, job_id, timeout=90)
                console.print(render_job(job))
                if job["status"] != "succeeded":
                    raise RuntimeError(f"job ended {job['status']}: {job.get('error')} {job.get('error_cause') or ''}")
        console.print("[green]✓ demo passed: one signed webhook, one job, both stages succeeded[/green]")
        return 0
    except Exception as exc:  # the demo's one job is to say what went wrong
        console.print(f"[red]✗ demo failed: {exc}[/red]")
        for log in sorted(work.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            console.print(f"[dim]--- {log.name} (last lines)[/dim]")
            for line in tail:
                console.print(line, style="dim", markup=False, highlight=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())
