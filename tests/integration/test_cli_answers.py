"""What the CLI answers says what happened: a duplicate names the existing job's status (and how
to run it again), a rejection's reason and actor are in `status` and its JSON, the last successful
stage is one that succeeded, `logs -f` names the approval gate it waits at and the command that
opens it, and empty fields are left out of the status line.

The stages are run the way relevo-agent runs them (claim, accept, report), without agent processes."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relevo_cli.api import RelevoApi
from relevo_cli.commands.common import console
from relevo_cli.main import app
from relevo_core.aws import client
from tests.helpers.stack import receive_stage, register_project, wait_for_execution, wait_until
from tests.helpers.state_machine import agent_runs, claim_and_accept, wait_for_run_token

runner = CliRunner()


def _stack_file(local_stack, tmp_path: Path) -> str:
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(local_stack.model_dump()))
    return str(path)


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI's console took its width when it was created; wide enough that no table cell wraps.
    monkeypatch.setattr(console, "width", 250)


def _cli(stack_file: str, *args: str, exit_code: int = 0):
    result = runner.invoke(app, [*args, "--stack-file", stack_file])
    assert result.exit_code == exit_code, result.output
    return result.output


def _status(api: RelevoApi, job_id: str, wanted: str) -> dict:
    return wait_until(
        lambda: (job := api.get_job(job_id))["status"] == wanted and job, 30, f"{job_id} {wanted}"
    )


def test_a_duplicate_names_the_jobs_status_and_how_to_run_it_again(local_stack, project_id, tmp_path: Path):
    register_project(local_stack, project_id, [{"name": "build", "run": "make"}], queue_timeout_sec=600)
    stack_file, api, commit = (
        _stack_file(local_stack, tmp_path),
        RelevoApi.for_stack(local_stack),
        secrets.token_hex(20),
    )
    job_id = _cli(stack_file, "run", project_id, "--commit", commit).split()[1]

    while_queued = _cli(stack_file, "run", project_id, "--commit", commit, exit_code=3)
    task, _ = receive_stage(local_stack, job_id)
    agent_runs(local_stack, task)
    _status(api, job_id, "succeeded")
    after_success = _cli(stack_file, "run", project_id, "--commit", commit, exit_code=3)

    status = api.get_job(job_id)["status"]
    assert while_queued.strip() in (
        f"already queued as {job_id} (queued)",
        f"already running as {job_id} (running)",
    ), (while_queued, status)
    assert (
        after_success.strip()
        == f"already ran as {job_id} (succeeded); `relevo project run {project_id} --again` runs it again"
    )


def test_a_duplicate_run_is_told_apart_from_a_new_job_by_its_exit_status_and_json(
    local_stack, project_id, tmp_path: Path
):
    """`JOB=$(relevo run P -q)` twice: the second is the first job again, which a script sees in
    the exit status (3) and `--json` (duplicate: true, with that job's status), and a person on
    stderr; an ended job (here canceled) is never handed back as a new run."""
    register_project(local_stack, project_id, [{"name": "build", "run": "make"}], queue_timeout_sec=600)
    stack_file, commit = _stack_file(local_stack, tmp_path), secrets.token_hex(20)

    def run(*extra: str):
        return runner.invoke(app, ["run", project_id, "--commit", commit, *extra, "--stack-file", stack_file])

    first = run("-q")
    job_id = first.stdout.strip()
    while_queued = run("-q")
    as_json = run("--json")
    RelevoApi.for_stack(local_stack).cancel_job(job_id)
    after_cancel = run("-q")

    assert first.exit_code == 0 and job_id.startswith("job_"), first.output
    assert (while_queued.exit_code, while_queued.stdout.strip()) == (3, job_id), while_queued.output
    assert (
        f"already queued as {job_id}" in while_queued.stderr
        or f"already running as {job_id}" in while_queued.stderr
    )
    answer = json.loads(as_json.stdout)
    assert as_json.exit_code == 3, as_json.output
    assert (answer["job_id"], answer["duplicate"], answer["status"] in ("queued", "running")) == (
        job_id,
        True,
        True,
    ), answer
    assert (after_cancel.exit_code, after_cancel.stdout.strip()) == (3, job_id), after_cancel.output
    assert (
        after_cancel.stderr.strip()
        == f"already ran as {job_id} (canceled); `relevo project run {project_id} --again` runs it again"
    )


def test_a_rejections_reason_and_actor_are_in_status_and_its_json(local_stack, project_id, tmp_path: Path):
    register_project(
        local_stack,
        project_id,
        [{"name": "build", "run": "make"}, {"name": "deploy", "run": "ship"}],
        approval={"enabled": True},
    )
    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    task, _ = receive_stage(local_stack, job_id)
    agent_runs(local_stack, task)
    _status(api, job_id, "waiting")
    me = client("sts").get_caller_identity()["Arn"]

    _cli(stack_file, "reject", job_id, "--reason", "crash on launch in QA")
    wait_for_execution(local_stack, job_id)
    shown = _cli(stack_file, "status", job_id)
    as_json = json.loads(_cli(stack_file, "status", job_id, "--json"))

    assert f"rejected by {me} before deploy: crash on launch in QA" in shown
    assert as_json["error"] == "Relevo.Approval.Rejected"
    assert {k: as_json["approval_decision"][k] for k in ("decision", "actor", "reason", "stage")} == {
        "decision": "rejected",
        "actor": me,
        "reason": "crash on launch in QA",
        "stage": "deploy",
    }
    # Not read from error_cause: on AWS its cause is the reason (SendTaskFailure's cause), but moto
    # 5.2.5's SendTaskFailure handler passes only the error on, so locally that cause is null.


def test_the_last_successful_stage_of_a_rerun_is_one_that_succeeded(local_stack, project_id, tmp_path: Path):
    # Given a job whose build succeeded and whose longrun was canceled while it ran
    stages = [
        {"name": "build", "run": "make"},
        {"name": "longrun", "run": "sleep 600"},
        {"name": "ship", "run": "ship"},
    ]
    register_project(local_stack, project_id, stages)
    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main", "commit": secrets.token_hex(20)})["job_id"]
    task, _ = receive_stage(local_stack, job_id)
    agent_runs(local_stack, task)
    task, _ = receive_stage(local_stack, job_id)
    wait_for_run_token(claim_and_accept(local_stack, task, "mac-a"))
    api.cancel_job(job_id)

    # When it is rerun from the stage after longrun
    rerun = api.rerun_job(job_id, "ship")["job_id"]

    # Then longrun, which never succeeded, is not its last successful stage: build is
    view = api.get_job(rerun)
    assert view["last_successful_stage"] == "build"
    assert "last successful stage: build" in _cli(stack_file, "status", rerun)
    api.cancel_job(rerun)


def test_logs_follow_names_the_gate_and_the_command_that_opens_it(local_stack, project_id, tmp_path: Path):
    register_project(
        local_stack,
        project_id,
        [{"name": "build", "run": "make"}, {"name": "deploy", "run": "ship"}],
        approval={"enabled": True},
    )
    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    gate = (
        f"waiting for approval before deploy: `relevo job approve {job_id}` (or `relevo job reject "
        f"{job_id} --reason …`)"
    )
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "relevo_cli.main",
            "logs",
            job_id,
            "-f",
            "--poll",
            "0.2",
            "--stack-file",
            stack_file,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    reader = threading.Thread(
        target=lambda: said.extend(line.rstrip("\n") for line in follower.stderr), daemon=True
    )
    reader.start()
    try:
        task, _ = receive_stage(local_stack, job_id)
        agent_runs(local_stack, task)
        # As a person would: approve once the follower says what it waits for.
        wait_until(lambda: gate in said, 60, "the gate line")
        time.sleep(1)  # several polls more at the gate: the line is not repeated
        api.approve(job_id, "ok")
        task, _ = receive_stage(local_stack, job_id)
        agent_runs(local_stack, task)
        follower.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        follower.kill()

    assert follower.returncode == 0, said
    assert said.count(gate) == 1, said
    assert said[-1] == f"job {job_id} succeeded"


def test_logs_of_a_job_waiting_for_an_agent_say_what_it_waits_for(local_stack, project_id, tmp_path: Path):
    """`relevo logs JOB` of a job whose stage no agent takes printed nothing and exited 0; it now
    says on stderr why the job waits, in words, as `relevo status` knows it."""
    register_project(
        local_stack,
        project_id,
        [{"name": "build", "run": "make"}],
        region_affinity="us-east",
        queue_timeout_sec=600,
    )
    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]
    try:
        job = wait_until(lambda: (j := api.get_job(job_id))["queue_reason"] and j, 30, "a queue reason")
        printed = runner.invoke(
            app, ["logs", job_id, "--stack-file", stack_file]
        )  # the spelling the issue used

        assert printed.exit_code == 0 and printed.stdout == "", printed.output
        said = printed.stderr.strip()
        assert said.startswith(f"job {job_id} waits: "), said
        reason = job["queue_reason"]
        assert {
            "agent_offline": "no agent of region affinity us-east is online",
            "agent_busy": "every agent of region affinity us-east has all its slots in use",
        }.get(reason, reason) in said, said
    finally:
        api.cancel_job(job_id)


def test_a_job_without_a_commit_shows_no_empty_commit(local_stack, project_id, tmp_path: Path):
    register_project(local_stack, project_id, [{"name": "build", "run": "make"}])
    stack_file, api = _stack_file(local_stack, tmp_path), RelevoApi.for_stack(local_stack)
    job_id = api.run_project(project_id, {"ref": "main"})["job_id"]

    shown = _cli(stack_file, "status", job_id)

    assert "ref main · region eu-west" in shown, shown
    assert " @ " not in shown and "last successful stage" not in shown
    api.cancel_job(job_id)
