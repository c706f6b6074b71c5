"""The DLQ freeze: an idempotency key dead-lettered more than twice in 24 h stops being retried
automatically, its owner is told once through SNS, and `relevo dlq unfreeze KEY` lifts it."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from relevo_cli.api import ApiError, RelevoApi
from relevo_cli.main import app
from relevo_core.aws import client
from relevo_core.config.sweeper import SweeperSettings
from relevo_core.intake.enqueue import enqueue, idempotency_key, project_cache
from relevo_core.intake.schedules import fire_schedule
from relevo_core.models.envelope import Trigger, TriggerType
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.recovery import key_freeze
from relevo_core.recovery.sweeper import sweep
from relevo_core.store import freezes
from relevo_core.store.codec import to_attributes
from relevo_core.store.jobs import get_envelope
from relevo_core.store.projects import get_project
from tests.helpers.payloads import push_body
from tests.helpers.stack import (
    deliver,
    receive_stage,
    register_project,
    subscribe_to_notifications,
    table_items,
    wait_for_execution,
)
from tests.helpers.state_machine import agent_runs

STAGES = [{"name": "build", "run": "make"}]
runner = CliRunner()


@pytest.fixture()
def frozen_notices(local_stack, project_id):
    """dlq.key_frozen notifications of the topic, read through an SQS subscription."""
    sqs = client("sqs")
    queue_url = subscribe_to_notifications(local_stack, f"freeze-{project_id}")
    seen: list[dict] = []

    def read(idempotency_key: str) -> list[dict]:
        while batch := sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            for message in batch:
                seen.append(json.loads(message["Body"]))
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        return [
            n for n in seen if n.get("event") == "dlq.key_frozen" and n["idempotency_key"] == idempotency_key
        ]

    return read


def _fails(stack, job_id, error="Relevo.Fatal.ExitCode") -> None:
    task, _ = receive_stage(stack, job_id)
    agent_runs(stack, task, succeed=False, error=error)
    assert wait_for_execution(stack, job_id, timeout=30)["status"] == "FAILED"


def _judge(stack) -> list[str]:
    """What the sweep does each minute (the stack's own timer may have done it first)."""
    return key_freeze.evaluate_pending(
        stack.table_name, stack.resources["NotificationTopic"], datetime.now(UTC)
    )


def _frozen(stack, key) -> bool:
    return "frozen_at" in freezes.get_freeze(stack.table_name, key)


def _automatic_repeat(stack, settings, project_id, commit, now):
    """The same push delivered again after its dedup window (on_repeat: run)."""
    project_cache.clear()
    project = get_project(stack.table_name, project_id)
    trigger = Trigger(type=TriggerType.WEBHOOK, source="github", delivery_id=secrets.token_hex(8))
    return enqueue(settings, project, trigger, "refs/heads/main", commit, commit, now=now)


# Three jobs fail through the emulator's state machine one after the other: more than the
# default 120 s on a loaded test worker.
@pytest.mark.timeout(300)
def test_three_dead_letters_in_a_day_freeze_the_key_until_it_is_unfrozen(
    local_stack, intake_settings, project_id, frozen_notices, tmp_path
):
    secret = register_project(local_stack, project_id, STAGES, dedup={"webhook": {"on_repeat": "run"}})
    commit = secrets.token_hex(20)
    first = deliver(local_stack, project_id, push_body(f"acme/{project_id}", commit), secret).json()["job_id"]
    key = get_envelope(local_stack.table_name, first).idempotency_key
    api = RelevoApi.for_stack(local_stack)
    _fails(local_stack, first)
    second = api.redrive(first)["job_id"]
    _fails(local_stack, second)

    _judge(local_stack)
    assert not _frozen(local_stack, key)  # two entries do not freeze

    third = api.redrive(second)["job_id"]
    _fails(local_stack, third)
    _judge(local_stack)

    assert _frozen(local_stack, key)
    # RecordDeadLetter may run twice: the repeat rewrites the same entry, and no second notice goes.
    client("dynamodb").update_item(
        TableName=local_stack.table_name,
        Key={"pk": {"S": f"DLQ#{third}"}, "sk": {"S": "DLQ"}},
        UpdateExpression="SET freeze_check = :p",
        ExpressionAttributeValues={":p": {"S": "pending"}},
    )
    _judge(local_stack)
    [notice] = frozen_notices(key)
    assert notice["project"] == project_id
    assert [entry["job_id"] for entry in notice["entries"]] == [first, second, third]
    assert key in notice["unfreeze"]["cli"]
    [listed] = [k for k in api.dead_letters()["frozen_keys"] if k["idempotency_key"] == key]
    assert [entry["job_id"] for entry in listed["entries"]] == [first, second, third]

    # Automatic runs of the key are refused ...
    later = datetime.now(UTC) + timedelta(hours=25)
    with pytest.raises(RelevoError) as refused:
        _automatic_repeat(local_stack, intake_settings, project_id, commit, later)
    assert (refused.value.code, refused.value.status) == (ErrorCode.KEY_FROZEN, 409)

    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(local_stack.model_dump()))
    listing = runner.invoke(app, ["dlq", "list", "--stack-file", str(stack_file)])
    assert listing.exit_code == 0 and "frozen idempotency keys" in listing.output, listing.output
    lifted = runner.invoke(app, ["dlq", "unfreeze", key, "--stack-file", str(stack_file)])
    assert lifted.exit_code == 0 and "unfrozen" in lifted.output, lifted.output

    _judge(local_stack)  # entries from before the unfreeze no longer count
    assert not _frozen(local_stack, key)
    assert all(k["idempotency_key"] != key for k in api.dead_letters()["frozen_keys"])
    assert len(frozen_notices(key)) == 1
    rerun = _automatic_repeat(local_stack, intake_settings, project_id, commit, later)
    assert rerun.outcome == "created" and rerun.job_id  # left to time out in its own project
    with pytest.raises(ApiError) as again:
        api.unfreeze_key(key)
    assert (again.value.status, again.value.code) == (404, "KEY_NOT_FROZEN")


def _record_dead_letter(stack, project_id, key, failed_at: datetime) -> str:
    """A dead-letter entry exactly as the state machine's RecordDeadLetter writes it, at an
    injected failure time."""
    job_id = "job_" + secrets.token_hex(12)
    client("dynamodb").put_item(
        TableName=stack.table_name,
        Item=to_attributes(
            {
                "pk": f"DLQ#{job_id}",
                "sk": "DLQ",
                "kind": "dlq",
                "job_id": job_id,
                "project": project_id,
                "state": "open",
                "idempotency_key": key,
                "error": "Relevo.Fatal.ExitCode",
                "cause": "{}",
                "failed_at": failed_at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
                "job_record": {},
                "freeze_check": "pending",
            }
        ),
    )
    return job_id


def _deployed_sweeper_settings(stack) -> SweeperSettings:
    variables = client("lambda").get_function_configuration(FunctionName=stack.resources["SweeperFunction"])[
        "Environment"
    ]["Variables"]
    return SweeperSettings.model_validate({name: str(value) for name, value in variables.items()})


def test_entries_older_than_a_day_do_not_count(local_stack, project_id, frozen_notices):
    # Registered through the API: its creator manages it, which unfreezing a key of it needs.
    register_project(local_stack, project_id, [{"name": "build", "run": "true"}])
    # A ref's identity: the key holds '/' as well as ':', and still travels in the unfreeze URL.
    key = f"{project_id}:ref:refs/heads/{secrets.token_hex(4)}:0123456789abcdef"
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    _record_dead_letter(local_stack, project_id, key, now - timedelta(hours=30))
    _record_dead_letter(local_stack, project_id, key, now - timedelta(hours=24))
    _record_dead_letter(local_stack, project_id, key, now)
    _judge(local_stack)
    assert not _frozen(local_stack, key)  # three entries, but never three inside one 24 h

    recent = [_record_dead_letter(local_stack, project_id, key, now + timedelta(hours=h)) for h in (1, 2)]
    # The sweep as deployed (its environment names the topic) decides.
    settings = _deployed_sweeper_settings(local_stack)
    sweep(settings, datetime.now(UTC), settings.notification_topic_arn)

    assert _frozen(local_stack, key)  # now, 1 h and 2 h later: three within 24 h
    [notice] = frozen_notices(key)
    assert len(notice["entries"]) == 3 and [e["job_id"] for e in notice["entries"]][1:] == recent
    assert RelevoApi.for_stack(local_stack).unfreeze_key(key)["idempotency_key"] == key
    assert not _frozen(local_stack, key)


def test_counted_entries_window_and_unfreeze():
    at = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    entries = [{"failed_at": (at - timedelta(hours=h)).isoformat()} for h in (25, 24, 23, 1, 0)]
    assert len(key_freeze.counted_entries(entries, at, None)) == 3  # 24 h ago exactly is outside
    assert len(key_freeze.counted_entries(entries, at, at - timedelta(hours=2))) == 2
    assert key_freeze.counted_entries(entries, at - timedelta(days=3), None) == []
    # Entries after the decision's own time never count: the decision does not depend on when it runs.
    assert len(key_freeze.counted_entries(entries, at - timedelta(hours=23), None)) == 3


def _freeze_by_entries(stack, project_id, key) -> None:
    now = datetime.now(UTC)
    for minutes in (3, 2, 1):
        _record_dead_letter(stack, project_id, key, now - timedelta(minutes=minutes))
    _judge(stack)
    assert _frozen(stack, key)


def test_webhook_and_schedule_runs_of_a_frozen_key_are_refused(local_stack, intake_settings, project_id):
    secret = register_project(
        local_stack, project_id, STAGES, schedules=[{"name": "nightly", "expression": "rate(1 day)"}]
    )
    project = get_project(local_stack.table_name, project_id)
    commit = secrets.token_hex(20)
    slot = "2026-03-01T03:00:00Z"
    _freeze_by_entries(local_stack, project_id, idempotency_key(project_id, commit, project.frozen_stages()))
    _freeze_by_entries(
        local_stack,
        project_id,
        idempotency_key(project_id, f"schedule:nightly:{slot}", project.frozen_stages()),
    )

    pushed = deliver(local_stack, project_id, push_body(f"acme/{project_id}", commit), secret)
    fired = fire_schedule(
        intake_settings, {"project_id": project_id, "schedule": "nightly", "scheduled_time": slot}
    )

    assert (pushed.status_code, pushed.json()["error"]) == (409, "KEY_FROZEN")
    assert fired is None  # acknowledged and logged: Scheduler retrying it could not help
    assert table_items(local_stack, f"DEDUP#{project_id}:") == []  # nothing was written
    other = deliver(local_stack, project_id, push_body(f"acme/{project_id}", secrets.token_hex(20)), secret)
    assert other.status_code == 202  # other keys of the project are not frozen


def test_while_frozen_a_persons_run_goes_but_its_stages_are_not_retried(local_stack, project_id):
    register_project(local_stack, project_id, STAGES)
    commit = secrets.token_hex(20)
    project = get_project(local_stack.table_name, project_id)
    key = idempotency_key(project_id, commit, project.frozen_stages())
    _freeze_by_entries(local_stack, project_id, key)

    job_id = RelevoApi.for_stack(local_stack).run_project(project_id, {"ref": "main", "commit": commit})[
        "job_id"
    ]

    assert get_envelope(local_stack.table_name, job_id).idempotency_key == key
    # A transient failure is retried up to 3 attempts by default; with the key frozen, none.
    _fails(local_stack, job_id, error="Relevo.Transient.NetworkTimeout")
    entry = RelevoApi.for_stack(local_stack).dead_letter(job_id)
    assert (entry["error"], entry["attempts"]) == ("Relevo.Transient.NetworkTimeout", 1)
