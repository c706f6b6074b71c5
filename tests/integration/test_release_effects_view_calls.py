"""The job view's release effects cost no AWS call (issue 44, point 6): GET /jobs/{id}'s `effect`
of a stage is derived from what the view already reads (the job's plan and its stage records), so
a job whose stages perform built-in effects is read with the very calls of a job whose stages run
commands. Every AWS API call of the request's thread and of the side-by-side pool's threads is
recorded through botocore (bench/harness.py), as tests/integration/test_claim_route_calls.py does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from bench import harness
from relevo_core.aws import client
from relevo_core.jobs.view import show_job
from relevo_core.models.envelope import new_job_id
from relevo_core.store.codec import to_attributes
from relevo_core.store.keys import JOB_SK, job_pk, stage_sk, stages_pk
from tests.unit.test_envelope import minimal_envelope

KEY = "relevo/prod/_release/demo/asc-key"
EFFECT_STAGES = [
    {
        "name": "upload",
        "effect": {"kind": "app_store_upload", "file": "App.ipa", "app_id": "1234567890", "api_key": KEY},
    },
    {"name": "notarize", "effect": {"kind": "notarization", "file": "App.dmg", "api_key": KEY}},
]
COMMAND_STAGES = [{"name": "upload", "command": "upload.sh"}, {"name": "notarize", "command": "notarize.sh"}]
VALUES = [
    {
        "app_id": "1234567890",
        "build_version": "1.4.0",
        "build_number": "42",
        "upload_id": "u-42",
        "apple_state": "VALID",
    },
    {"submission_id": "2efe41c0-6b3d", "sha256": "ab" * 32, "apple_state": "In Progress"},
]


class Calls:
    """The AWS calls of one thread (the reader's) and of the side-by-side pool's threads."""

    def __init__(self) -> None:
        self.reader: int | None = None
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def on_call(self, operation_model: Any, _request: Any, _result: Any) -> None:
        thread = threading.current_thread()
        if self.reader is not None and (
            thread.ident == self.reader or thread.name.startswith("side-by-side")
        ):
            with self._lock:
                self.calls.append(f"{operation_model.service_model.service_name}:{operation_model.name}")

    def of(self, read: Any) -> tuple[Any, list[str]]:
        self.calls, self.reader = [], threading.get_ident()
        try:
            return read(), sorted(self.calls)
        finally:
            self.reader = None


@pytest.fixture()
def recorded() -> Iterator[Calls]:
    calls = Calls()
    restore = harness.record_aws_calls(calls.on_call)
    try:
        yield calls
    finally:
        restore()


def _put_job(table: str, stages: list[dict[str, Any]]) -> str:
    """A running job of these stages: its upload succeeded, its notarization under way."""
    job_id = new_job_id(datetime.now(UTC).timestamp())
    envelope = minimal_envelope(job_id=job_id, project="fxshow-calls", stages=stages)
    dynamodb = client("dynamodb")
    dynamodb.put_item(
        TableName=table,
        Item=to_attributes(
            {
                "pk": job_pk(job_id),
                "sk": JOB_SK,
                "job_id": job_id,
                "project": "fxshow-calls",
                "status": "running",
                "envelope": envelope,
            }
        ),
    )
    for index, (status, values) in enumerate(zip(("succeeded", "running"), VALUES, strict=True)):
        record = {
            "pk": stages_pk(job_id),
            "sk": stage_sk(index),
            "stage_name": stages[index]["name"],
            "status": status,
            "attempt": 1,
            "agent_id": "mac-a",
            "outputs": values,
        }
        if status == "succeeded":
            record["receipt"] = {"exit_code": 0, "outputs": values}
        dynamodb.put_item(TableName=table, Item=to_attributes(record))
    return job_id


def test_a_jobs_release_effects_are_read_with_the_calls_of_a_job_without_any(local_stack, recorded):
    # Given two jobs alike but for their stages: built-in effects in one, commands in the other
    with_effects = _put_job(local_stack.table_name, EFFECT_STAGES)
    with_commands = _put_job(local_stack.table_name, COMMAND_STAGES)
    now = datetime.now(UTC)

    # When each is read as GET /jobs/{id} reads it
    effects_view, effects_calls = recorded.of(lambda: show_job(local_stack.table_name, with_effects, now))
    commands_view, commands_calls = recorded.of(lambda: show_job(local_stack.table_name, with_commands, now))

    # Then the effect stages say their effect, the command stages none
    assert [stage["effect"]["words"] for stage in effects_view["stages"]] == [
        "uploaded build 42 (VALID)",
        "notarization In Progress (submission 2efe41c0…)",
    ]
    assert [stage["effect"] for stage in commands_view["stages"]] == [None, None]
    # And saying them took no call of its own: the same calls, call for call
    assert effects_calls == commands_calls, (effects_calls, commands_calls)
    assert effects_calls and all(call.startswith("dynamodb:") for call in effects_calls), effects_calls
