"""The schedule trigger: project schedules kept in EventBridge Scheduler, fired through intake."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError
from pydantic import ValidationError

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.aws import client
from relevo_core.intake.schedules import fire_schedule
from relevo_core.models.envelope import TriggerType
from relevo_core.models.project_schedule import ProjectSchedule
from relevo_core.store.jobs import get_envelope
from relevo_local.scheduler import ScheduleFirer

STAGES = [{"name": "build", "run": "true"}, {"name": "sign", "run": "true"}]


def _group(stack) -> str:
    return f"{stack.stack_name}-projects"


def _function_arn(stack, logical_id: str) -> str:
    return client("lambda").get_function_configuration(FunctionName=stack.resources[logical_id])[
        "FunctionArn"
    ]


def _role_arn(stack, logical_id: str) -> str:
    name = stack.resources[logical_id].split("/")[-1]
    return client("iam").get_role(RoleName=name)["Role"]["Arn"]


def register_project(stack, project_id: str, stages: list[dict], **extra) -> None:
    """Apply (or re-apply) a project through the API; schedules need no webhook secret."""
    RelevoApi.for_stack(stack).put_project(
        project_id, {"repo": f"acme/{project_id}", "region_affinity": "eu-west", "stages": stages, **extra}
    )


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------- model


@pytest.mark.parametrize(
    "expression",
    [
        "rate(1 minute)",
        "rate(5 minutes)",
        "rate(1 hour)",
        "rate(2 days)",
        "cron(0 3 * * ? *)",
        "cron(15 10 ? * MON-FRI *)",
    ],
)
def test_schedule_expressions_of_eventbridge_are_accepted(expression):
    assert ProjectSchedule(name="nightly", expression=expression).expression == expression


@pytest.mark.parametrize(
    "expression",
    [
        "rate(0 minutes)",
        "rate(1 minutes)",
        "rate(5 minute)",
        "rate(1 week)",
        "cron(0 3 * * *)",
        "cron(0 3 * * * *)",
        "every day",
        "at(2026-01-01T00:00:00)",
    ],
)
def test_other_schedule_expressions_are_refused(expression):
    with pytest.raises(ValidationError):
        ProjectSchedule(name="nightly", expression=expression)


def test_schedule_declarations_are_checked_on_apply(local_stack, project_id):
    api = RelevoApi.for_stack(local_stack)
    base = {"repo": f"acme/{project_id}", "region_affinity": "eu-west", "stages": STAGES}
    for schedules in (
        [{"name": "a", "expression": "rate(1 hour)"}, {"name": "a", "expression": "rate(2 hours)"}],
        [{"name": "a", "expression": "rate(1 hour)", "stages": ["deploy"]}],
        [{"name": "a--b", "expression": "rate(1 hour)"}],
    ):
        with pytest.raises(ApiError) as refused:
            api.put_project(project_id, {**base, "schedules": schedules})
        assert (refused.value.status, refused.value.code) == (422, "VALIDATION_FAILED"), schedules


# ---------------------------------------------------------------- registry sync


def test_applying_a_project_creates_updates_and_deletes_its_schedules(local_stack, project_id):
    scheduler = client("scheduler")
    register_project(
        local_stack,
        project_id,
        STAGES,
        schedules=[
            {
                "name": "nightly",
                "expression": "cron(0 3 * * ? *)",
                "timezone": "Europe/Paris",
                "stages": ["build"],
            }
        ],
    )

    created = scheduler.get_schedule(Name=f"{project_id}--nightly", GroupName=_group(local_stack))
    assert created["ScheduleExpression"] == "cron(0 3 * * ? *)"
    assert created["ScheduleExpressionTimezone"] == "Europe/Paris"
    assert created["Target"]["Arn"] == _function_arn(local_stack, "ScheduleTriggerFunction")
    assert created["Target"]["RoleArn"] == _role_arn(local_stack, "SchedulerInvokeRole")
    assert json.loads(created["Target"]["Input"]) == {
        "project_id": project_id,
        "schedule": "nightly",
        "scheduled_time": "<aws.scheduler.scheduled-time>",
    }

    register_project(
        local_stack, project_id, STAGES, schedules=[{"name": "nightly", "expression": "rate(6 hours)"}]
    )
    assert (
        scheduler.get_schedule(Name=f"{project_id}--nightly", GroupName=_group(local_stack))[
            "ScheduleExpression"
        ]
        == "rate(6 hours)"
    )

    register_project(local_stack, project_id, STAGES)
    with pytest.raises(ClientError) as gone:
        scheduler.get_schedule(Name=f"{project_id}--nightly", GroupName=_group(local_stack))
    assert gone.value.response["Error"]["Code"] == "ResourceNotFoundException"


# ---------------------------------------------------------------- firing


def test_a_slot_fired_twice_makes_one_schedule_job(local_stack, intake_settings, project_id):
    register_project(
        local_stack,
        project_id,
        STAGES,
        schedules=[{"name": "hourly", "expression": "rate(1 hour)", "ref": "develop", "stages": ["sign"]}],
    )
    event = {"project_id": project_id, "schedule": "hourly", "scheduled_time": "2026-11-29T18:00:00Z"}

    first = fire_schedule(intake_settings, event)
    second = fire_schedule(intake_settings, event)
    later = fire_schedule(intake_settings, {**event, "scheduled_time": "2026-11-29T19:00:00Z"})

    assert first is not None and second is not None and later is not None
    assert (second.job_id, second.duplicate) == (first.job_id, True)
    assert later.job_id != first.job_id and not later.duplicate
    envelope = get_envelope(local_stack.table_name, first.job_id)
    assert (envelope.trigger.type, envelope.trigger.source) == (TriggerType.SCHEDULE, "scheduler")
    assert (envelope.ref, envelope.commit, [s.name for s in envelope.stages]) == ("develop", None, ["sign"])


def test_the_same_schedule_name_and_slot_in_two_projects_makes_two_jobs(
    local_stack, intake_settings, project_id
):
    other = project_id + "-x"
    for pid in (project_id, other):
        register_project(
            local_stack, pid, STAGES, schedules=[{"name": "nightly", "expression": "rate(1 day)"}]
        )
    slot = "2026-11-29T03:00:00Z"
    one = fire_schedule(
        intake_settings, {"project_id": project_id, "schedule": "nightly", "scheduled_time": slot}
    )
    two = fire_schedule(intake_settings, {"project_id": other, "schedule": "nightly", "scheduled_time": slot})
    assert one and two and one.job_id != two.job_id and not two.duplicate
    assert get_envelope(local_stack.table_name, one.job_id).ref == "main"


def test_a_vanished_project_or_schedule_is_ignored(local_stack, intake_settings, project_id):
    slot = "2026-11-29T03:00:00Z"
    assert (
        fire_schedule(
            intake_settings, {"project_id": project_id, "schedule": "nightly", "scheduled_time": slot}
        )
        is None
    )
    register_project(local_stack, project_id, STAGES)
    assert (
        fire_schedule(
            intake_settings, {"project_id": project_id, "schedule": "nightly", "scheduled_time": slot}
        )
        is None
    )
    assert fire_schedule(intake_settings, {"project_id": project_id}) is None


def test_the_local_stack_fires_a_rate_schedule_when_due(local_stack, intake_settings, project_id):
    register_project(
        local_stack,
        project_id,
        STAGES,
        schedules=[
            {"name": "often", "expression": "rate(1 minute)"},
            {"name": "nightly", "expression": "cron(0 3 * * ? *)"},
        ],
    )
    target_arn = _function_arn(local_stack, "ScheduleTriggerFunction")
    invoked: list[tuple[str, dict]] = []

    def invoke(arn: str, event: dict) -> None:
        invoked.append((arn, event))
        fire_schedule(intake_settings, event)  # what the function does

    clock = _Clock(1_800_000_000.0)  # 2027-01-15T08:00:00Z
    firer = ScheduleFirer(client("scheduler"), [_group(local_stack)], invoke, clock=clock)

    def ours(fired):
        return [f for f in fired if f[0].startswith(f"{project_id}--")]

    assert ours(firer.poll()) == []  # first seen: due one period later
    clock.now += 59
    assert ours(firer.poll()) == []
    clock.now += 1
    assert ours(firer.poll()) == [(f"{project_id}--often", "2027-01-15T08:01:00Z")]
    clock.now += 30
    assert ours(firer.poll()) == []
    clock.now += 30
    assert ours(firer.poll()) == [(f"{project_id}--often", "2027-01-15T08:02:00Z")]

    mine = [(arn, event) for arn, event in invoked if event.get("project_id") == project_id]
    assert [arn for arn, _ in mine] == [target_arn, target_arn]
    assert [event for _, event in mine] == [
        {"project_id": project_id, "schedule": "often", "scheduled_time": "2027-01-15T08:01:00Z"},
        {"project_id": project_id, "schedule": "often", "scheduled_time": "2027-01-15T08:02:00Z"},
    ]
    # Each slot made its job through intake.
    first = fire_schedule(intake_settings, mine[0][1])
    assert first is not None and first.duplicate
    assert (
        get_envelope(local_stack.table_name, first.job_id).trigger.delivery_id
        == f"{project_id}--often:2027-01-15T08:01:00Z"
    )
