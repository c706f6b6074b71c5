"""The dead-letter queue: what a failed job leaves behind, and resuming it from its failed stage."""

from __future__ import annotations

import secrets

import pytest

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.store.jobs import get_envelope
from tests.helpers.payloads import push_body
from tests.helpers.stack import deliver, receive_stage, register_project, wait_for_execution
from tests.helpers.state_machine import agent_runs

STAGES = [
    {"name": "build", "run": "make"},
    {"name": "sign", "run": "codesign"},
    {"name": "upload", "run": "altool"},
]


def _dead_lettered_job(stack, project_id) -> tuple[str, bytes, str]:
    """A job whose second stage failed for good: (job id, its push body, the webhook secret)."""
    secret = register_project(stack, project_id, STAGES)
    body = push_body(f"acme/{project_id}", secrets.token_hex(20))
    job_id = deliver(stack, project_id, body, secret).json()["job_id"]
    task, _ = receive_stage(stack, job_id)
    agent_runs(stack, task)
    task, _ = receive_stage(stack, job_id)
    agent_runs(stack, task, succeed=False, error="Relevo.Fatal.ProfileMismatch")
    assert wait_for_execution(stack, job_id)["status"] == "FAILED"
    return job_id, body, secret


def test_a_dead_lettered_job_is_listed_and_redriven_from_its_failed_stage(local_stack, project_id):
    job_id, body, secret = _dead_lettered_job(local_stack, project_id)
    api = RelevoApi.for_stack(local_stack)

    entry = api.dead_letter(job_id)
    listed = {e["job_id"]: e for e in api.dead_letters()["entries"]}

    assert listed[job_id] == entry
    assert (
        entry["failed_stage"],
        entry["error"],
        entry["attempts"],
        entry["last_successful_stage"],
        entry["state"],
    ) == (
        "sign",
        "Relevo.Fatal.ProfileMismatch",
        1,
        "build",
        "open",
    )

    resumed = api.redrive(job_id)

    new_id = resumed["job_id"]
    assert resumed["outcome"] == "redriven" and new_id != job_id
    original, redriven = (
        get_envelope(local_stack.table_name, job_id),
        get_envelope(local_stack.table_name, new_id),
    )
    assert (redriven.idempotency_key, redriven.retry_of, redriven.from_stage) == (
        original.idempotency_key,
        job_id,
        "sign",
    )
    assert redriven.stages == original.stages  # its own frozen plan
    # A new job, retained from its own creation (template defaults: 30 days, logs 14).
    created = int(redriven.created_at.timestamp())
    assert (redriven.ttl, redriven.log_ttl) == (created + 30 * 24 * 3600, created + 14 * 24 * 3600)
    for expected in ("sign", "upload"):
        task, _ = receive_stage(local_stack, new_id)
        assert task["stage"] == expected
        agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, new_id)["status"] == "SUCCEEDED"
    # The idempotency key now answers with the resumed job, and an entry redrives once.
    assert deliver(local_stack, project_id, body, secret).json() == {"job_id": new_id, "duplicate": True}
    assert api.dead_letter(job_id)["state"] == "redriven"
    with pytest.raises(ApiError) as twice:
        api.redrive(job_id)
    assert (twice.value.status, twice.value.code) == (404, "DLQ_ENTRY_NOT_FOUND")


def test_an_entry_still_resumes_its_job_after_the_failed_job_was_deleted(local_stack, project_id):
    """The entry holds everything a resume needs (the job record with its frozen envelope), so
    deleting the failed job's records, logs and artifacts does not strand it."""
    job_id, _, _ = _dead_lettered_job(local_stack, project_id)
    api = RelevoApi.for_stack(local_stack)
    original = get_envelope(local_stack.table_name, job_id)
    api.delete_job(job_id)
    with pytest.raises(ApiError) as gone:
        api.get_job(job_id)
    assert gone.value.code in ("JOB_NOT_FOUND", "FORBIDDEN")

    resumed = api.redrive(job_id)

    redriven = get_envelope(local_stack.table_name, resumed["job_id"])
    assert (redriven.idempotency_key, redriven.retry_of, redriven.from_stage, redriven.stages) == (
        original.idempotency_key,
        job_id,
        "sign",
        original.stages,
    )
    for expected in ("sign", "upload"):
        task, _ = receive_stage(local_stack, resumed["job_id"])
        assert task["stage"] == expected
        agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, resumed["job_id"])["status"] == "SUCCEEDED"
