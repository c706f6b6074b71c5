"""api / manual / retry triggers and the release of a held job, through the IAM-signed API."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import pytest

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.intake.enqueue import enqueue, project_cache
from relevo_core.models.envelope import Trigger, TriggerType
from relevo_core.store.jobs import get_envelope
from relevo_core.store.projects import get_project
from tests.helpers.stack import job_execution_arn, register_project, table_items

STAGES = [{"name": "build", "run": "true"}, {"name": "sign", "run": "true"}]


def test_a_double_clicked_manual_run_makes_one_job_with_manual_priority(local_stack, project_id):
    register_project(local_stack, project_id, STAGES)
    api = RelevoApi.for_stack(local_stack)

    first = api.run_project(project_id, {"trigger": "manual", "ref": "main"})
    second = api.run_project(project_id, {"trigger": "manual", "ref": "main"})
    again = api.run_project(
        project_id, {"trigger": "manual", "ref": "main", "request_id": secrets.token_hex(4)}
    )

    assert second == {"job_id": first["job_id"], "duplicate": True}
    assert again["job_id"] != first["job_id"]
    envelope = get_envelope(local_stack.table_name, first["job_id"])
    assert (envelope.trigger.type, envelope.priority, envelope.ref) == (TriggerType.MANUAL, 10, "main")
    assert envelope.trigger.actor and envelope.trigger.actor.startswith("arn:aws:")


def test_api_run_of_some_stages_freezes_only_those(local_stack, project_id):
    register_project(local_stack, project_id, STAGES)
    result = RelevoApi.for_stack(local_stack).run_project(
        project_id, {"ref": "release/1.4", "stages": ["sign"]}
    )
    envelope = get_envelope(local_stack.table_name, result["job_id"])
    assert [s.name for s in envelope.stages] == ["sign"] and envelope.priority == 0


def test_rerun_from_a_stage_is_a_new_retry_job(local_stack, project_id):
    register_project(local_stack, project_id, STAGES)
    api = RelevoApi.for_stack(local_stack)
    original = api.run_project(project_id, {"ref": "main", "commit": secrets.token_hex(20)})

    rerun = api.rerun_job(original["job_id"], "sign")

    envelope = get_envelope(local_stack.table_name, rerun["job_id"])
    assert (envelope.trigger.type, envelope.retry_of, envelope.from_stage) == (
        TriggerType.RETRY,
        original["job_id"],
        "sign",
    )
    with pytest.raises(ApiError) as refused:
        api.rerun_job(original["job_id"], "deploy")
    assert (refused.value.status, refused.value.code) == (422, "STAGE_UNKNOWN")


def test_a_held_job_starts_when_released_and_only_then(local_stack, intake_settings, project_id):
    register_project(local_stack, project_id, STAGES)
    project_cache.clear()
    project = get_project(local_stack.table_name, project_id)
    window, _ = project.dedup_for("webhook")
    commit = secrets.token_hex(20)
    trigger = Trigger(type=TriggerType.WEBHOOK, source="github")
    enqueue(
        intake_settings,
        project,
        trigger,
        "refs/heads/main",
        commit,
        commit,
        now=datetime.now(UTC) - timedelta(seconds=window + 5),
    )
    held = enqueue(intake_settings, project, trigger, "refs/heads/main", commit, commit)
    assert held.outcome == "held"
    api = RelevoApi.for_stack(local_stack)
    assert api.get_job(held.job_id)["held_reason"] == "repeat_after_window"

    released = api.release_job(held.job_id)
    with pytest.raises(ApiError) as twice:
        api.release_job(held.job_id)

    assert released["job_id"] == held.job_id
    assert (twice.value.status, twice.value.code) == (409, "JOB_NOT_HELD")
    record = {i["sk"]["S"]: i for i in table_items(local_stack, f"JOB#{held.job_id}")}["JOB"]
    assert record["status"]["S"] in ("queued", "running")
    assert "held_reason" not in record and api.get_job(held.job_id)["held_reason"] is None
    # The release wrote it, or the execution it started already has.
    assert record["last_writer"]["S"].split(":")[0] in ("operator", "state_machine")
    from relevo_core.aws import client

    assert (
        client("stepfunctions").describe_execution(executionArn=job_execution_arn(local_stack, held.job_id))[
            "name"
        ]
        == held.job_id
    )


def test_projects_are_listed(local_stack, project_id):
    register_project(local_stack, project_id, STAGES)
    listing = RelevoApi.for_stack(local_stack).list_projects()
    assert project_id in {p["id"] for p in listing["projects"]}
    assert listing["count"] == len(listing["projects"])
