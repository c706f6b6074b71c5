"""Plan limits on the embedded stack: a plan over a limit is refused at apply and at enqueue with
PLAN_TOO_LARGE and nothing written; the largest plan the limits allow runs through success, a
retry and the dead-letter path; and the emulator, which enforces Step Functions' 256 KiB payload
quota (moto 5.2.5 counts a state's data as `json.dumps` does), refuses the dead-letter path just
past where relevo_core.plan_limits' arithmetic puts it (within the few bytes by which two jobs'
packed envelopes differ), far above what the limits allow."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from typing import Any

import pytest

from relevo_cli.api import ApiError, RelevoApi
from relevo_core.aws import client
from relevo_core.execution import start_job_execution
from relevo_core.intake.enqueue import build_envelope, enqueue, project_cache
from relevo_core.models.envelope import Trigger, TriggerType
from relevo_core.models.errors import ErrorCode, RelevoError
from relevo_core.models.plan import StagePlan
from relevo_core.plan_limits import (
    MAX_ENVELOPE_BYTES,
    MAX_FAILURE_CAUSE_CHARS,
    STATE_PAYLOAD_QUOTA_BYTES,
    require_envelope_fits,
    state_bytes,
)
from relevo_core.store import job_creation, jobs, locks
from relevo_core.store.projects import get_project, put_project
from tests.helpers.stack import (
    QueueSlots,
    history,
    job_record,
    receive_stage,
    register_project,
    table_items,
    wait_for_execution,
    wait_until,
)
from tests.helpers.state_machine import agent_runs, claim_and_accept, enqueue_job, wait_for_run_token
from tests.unit.test_plan_limit_arithmetic import largest_allowed_stages

MARGIN_BYTES = 44 * 1024  # relevo_core.plan_limits' stated margin
# How much two jobs' packed envelopes of the same plan may differ (their random commits and ids
# compress a few bytes apart); measured within 8.
PACKED_SLACK = 64


def _packed_bytes(stack, job_id: str) -> int:
    """The job record's packed envelope as the dead-letter path reads it back (base64: no escapes)."""
    return len(job_record(stack, job_id)["packed_envelope"])


def _declaration(project_id: str, **settings: Any) -> dict[str, Any]:
    """What tests.helpers.stack.register_project declares, but the stages and webhook."""
    return {
        "id": project_id,
        "repo": f"acme/{project_id}",
        "region_affinity": "eu-west",
        "lease_ttl_sec": 10,
        "queue_timeout_sec": 30,
        **settings,
    }


def _largest_state_bytes(stack, job_id: str) -> int:
    """The largest state input or output of the execution, counted as the emulator counts it."""
    sizes = [0]
    for event in history(stack, job_id):
        for details, field in (("stateEnteredEventDetails", "input"), ("stateExitedEventDetails", "output")):
            data = event.get(details, {}).get(field)
            if data:
                sizes.append(state_bytes(json.loads(data)))
    return max(sizes)


def _fail_stage(stack, task: dict, error: str, cause: str) -> None:
    token = wait_for_run_token(claim_and_accept(stack, task, "mac-a"))
    client("stepfunctions").send_task_failure(taskToken=token, error=error, cause=cause)


def test_apply_refuses_a_plan_one_byte_over_and_writes_nothing(local_stack, project_id):
    stages = largest_allowed_stages(_declaration(project_id))
    over = stages[:-1] + [{**stages[-1], "run": stages[-1]["run"] + "x"}]

    with pytest.raises(ApiError) as refused:
        register_project(local_stack, project_id, over)

    assert (refused.value.status, refused.value.code) == (422, "PLAN_TOO_LARGE")
    assert (
        f"{MAX_ENVELOPE_BYTES + 1:,} bytes" in refused.value.body["message"]
        and f"{MAX_ENVELOPE_BYTES:,}" in refused.value.body["message"]
    )
    assert refused.value.body["details"] == {
        "limit": "envelope_bytes",
        "size": MAX_ENVELOPE_BYTES + 1,
        "allowed": MAX_ENVELOPE_BYTES,
    }
    assert table_items(local_stack, f"PROJECT#{project_id}") == []
    RelevoApi.for_stack(local_stack).put_project(
        project_id, {**_declaration(project_id), "stages": stages}
    )  # at the limit: accepted
    assert len(get_project(local_stack.table_name, project_id).stages) == 32


def test_enqueue_refuses_a_stored_plan_over_the_limit_and_writes_nothing(
    local_stack, intake_settings, project_id
):
    """A plan stored under other limits (here: written past the API) is refused when a job of it
    is enqueued, through the API's run and through intake itself. (A job's own fields are shorter
    than the longest apply allows for, so the plan grows by more than that slack.)"""
    stages = largest_allowed_stages(_declaration(project_id))
    register_project(local_stack, project_id, stages)
    stored = get_project(local_stack.table_name, project_id)
    grown_stage = stored.stages[2].model_copy(update={"run": stored.stages[2].run + "x" * 4000})
    grown = stored.model_copy(update={"stages": stored.stages[:2] + (grown_stage,) + stored.stages[3:]})
    put_project(local_stack.table_name, grown, "test")
    project_cache.clear()
    slots = QueueSlots(local_stack, project_id)

    with pytest.raises(ApiError) as refused:
        RelevoApi.for_stack(local_stack).run_project(
            project_id, {"ref": "main", "commit": secrets.token_hex(20)}
        )
    with pytest.raises(RelevoError) as refused_by_intake:
        enqueue(
            intake_settings,
            grown,
            Trigger(type=TriggerType.API, source="api"),
            "main",
            None,
            secrets.token_hex(8),
        )

    assert (refused.value.status, refused.value.code) == (422, "PLAN_TOO_LARGE")
    assert refused_by_intake.value.code is ErrorCode.PLAN_TOO_LARGE
    assert RelevoApi.for_stack(local_stack).list_jobs(project=project_id)["jobs"] == []
    assert slots.change() == 0


def test_the_largest_allowed_plan_runs_retries_and_reaches_the_dead_letter_queue(
    local_stack, intake_settings, project_id
):
    settings = {"queue_timeout_sec": 600, "retry": {"backoff_base_sec": 0}}
    stages = largest_allowed_stages(_declaration(project_id, **settings))
    register_project(local_stack, project_id, stages, **settings)
    running = enqueue_job(local_stack, intake_settings, project_id)
    # A second job with the longest fields a job brings, waiting for the first (its dead-letter
    # path then also holds what waiting and waking add).
    project_cache.clear()
    commit = secrets.token_hex(20)
    trigger = Trigger(type=TriggerType.API, source="s" * 64, delivery_id="d" * 128, actor="a" * 512)
    failing = enqueue(
        intake_settings, get_project(local_stack.table_name, project_id), trigger, "r" * 256, commit, commit
    ).job_id
    wait_until(lambda: job_record(local_stack, failing).get("wake_token"), 60, f"{failing} parked")

    task, _ = receive_stage(local_stack, running)
    agent_runs(local_stack, task, succeed=False, error="Relevo.Transient.ExitCode")  # retried
    for index in range(len(stages)):
        task, _ = receive_stage(local_stack, running, timeout=30)
        assert task["stage_index"] == index
        agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, running, timeout=60)["status"] == "SUCCEEDED"
    view = RelevoApi.for_stack(local_stack).get_job(running)
    assert view["stages"][0]["retry_count"] == 1 and view["status"] == "succeeded"

    task, _ = receive_stage(local_stack, failing, timeout=60)
    # The longest cause Relevo sends, of a character JSON escapes (7 bytes once twice escaped).
    _fail_stage(local_stack, task, "Relevo.Fatal.ExitCode", "\u0001" * MAX_FAILURE_CAUSE_CHARS)

    described = wait_for_execution(local_stack, failing, timeout=60)
    assert (described["status"], described["error"]) == ("FAILED", "Relevo.Fatal.ExitCode")
    entry = RelevoApi.for_stack(local_stack).dead_letter(failing)
    assert (entry["failed_stage"], entry["error"]) == (stages[0]["name"], "Relevo.Fatal.ExitCode")
    largest = max(_largest_state_bytes(local_stack, job_id) for job_id in (running, failing))
    print(f"\nlargest allowed plan: largest state {largest:,} bytes of {STATE_PAYLOAD_QUOTA_BYTES:,}")
    assert largest <= STATE_PAYLOAD_QUOTA_BYTES - MARGIN_BYTES


def _started_past_the_limits(stack, settings, project_id: str, commands: list[int]) -> str:
    """A job whose stages have commands of these lengths, written and started past intake's limits."""
    project_cache.clear()
    stored = get_project(stack.table_name, project_id)
    plan = tuple(StagePlan(name=f"s{index}", command="x" * length) for index, length in enumerate(commands))
    now = datetime.now(UTC)
    commit = secrets.token_hex(20)
    envelope = build_envelope(
        settings,
        stored,
        Trigger(type=TriggerType.API, source="api"),
        "main",
        commit,
        plan,
        f"{project_id}:{commit}:x",
        now,
    )
    created = job_creation.create_job(stack.table_name, envelope, 600, settings.queue_limit, now)
    assert isinstance(created, job_creation.Created)
    start_job_execution(settings, envelope, created.took_lock)
    return envelope.job_id


def _fails_first_stage(stack, job_id: str) -> dict:
    task, _ = receive_stage(stack, job_id, timeout=30)
    _fail_stage(stack, task, "Relevo.Fatal.ExitCode", "exit 1")
    return wait_for_execution(stack, job_id, timeout=60)


def test_enqueue_refuses_a_stored_command_over_its_limit_without_a_server_error(
    local_stack, intake_settings, project_id
):
    register_project(local_stack, project_id, [{"name": "build", "run": "true"}])
    stored = get_project(local_stack.table_name, project_id)
    put_project(
        local_stack.table_name,
        stored.model_copy(update={"stages": (stored.stages[0].model_copy(update={"run": "x" * 20_000}),)}),
        "test",
    )
    project_cache.clear()

    with pytest.raises(ApiError) as refused:
        RelevoApi.for_stack(local_stack).run_project(
            project_id, {"ref": "main", "commit": secrets.token_hex(20)}
        )

    assert (refused.value.status, refused.value.code) == (422, "PLAN_TOO_LARGE")
    assert refused.value.body["details"] == {"limit": "command_bytes", "size": 20_000, "allowed": 16_384}


def test_the_emulator_refuses_the_dead_letter_path_where_the_arithmetic_puts_it(
    local_stack, intake_settings, project_id
):
    register_project(local_stack, project_id, [{"name": "s0", "run": "true"}], queue_timeout_sec=600)
    # Commands at their limit, enough of them that the rest of the quota fits in one more command.
    full = [16_000] * 15
    probe = _started_past_the_limits(local_stack, intake_settings, project_id, full + [1_000])
    assert _fails_first_stage(local_stack, probe)["status"] == "FAILED"
    measured = _largest_state_bytes(local_stack, probe)
    # Each character of a command is in the dead-letter path's state once in the execution input;
    # the job record read back holds the envelope packed (store.codec), where a run of one character
    # takes next to nothing, but where two jobs' random commits and ids compress to a few bytes more
    # or less: hence PACKED_SLACK. The emulator refuses a state of 262,144 bytes or more.
    longest_last = 1_000 + (STATE_PAYLOAD_QUOTA_BYTES - 1 - measured) - PACKED_SLACK
    assert 1_000 < longest_last <= 16_384 - 4 * PACKED_SLACK

    fits = _started_past_the_limits(local_stack, intake_settings, project_id, full + [longest_last])
    fits_ended = _fails_first_stage(local_stack, fits)
    fits_state = _largest_state_bytes(local_stack, fits)
    assert STATE_PAYLOAD_QUOTA_BYTES - 1 - 2 * PACKED_SLACK <= fits_state < STATE_PAYLOAD_QUOTA_BYTES
    # One past: the command grows by what the fitting state lacked, and the slack.
    grown = STATE_PAYLOAD_QUOTA_BYTES - fits_state + PACKED_SLACK
    over = _started_past_the_limits(local_stack, intake_settings, project_id, full + [longest_last + grown])
    # Its dead-letter state, from the fitting one's and what the table holds of both.
    over_state = fits_state + grown + _packed_bytes(local_stack, over) - _packed_bytes(local_stack, fits)
    assert STATE_PAYLOAD_QUOTA_BYTES <= over_state <= STATE_PAYLOAD_QUOTA_BYTES + 2 * PACKED_SLACK
    over_ended = _fails_first_stage(local_stack, over)

    print(
        f"\nthe dead-letter path reaches {STATE_PAYLOAD_QUOTA_BYTES:,} bytes with a plan of "
        f"{sum(full) + longest_last + grown:,} command characters (its state {over_state:,} bytes; "
        f"{fits_state:,} fit)"
    )
    assert (fits_ended["status"], fits_ended["error"]) == ("FAILED", "Relevo.Fatal.ExitCode")
    assert table_items(local_stack, f"DLQ#{fits}")
    # The largest state is the last of the path (the wake of the next waiter, after the entry is
    # recorded and the lock released), so the plan past it dies there.
    assert (over_ended["status"], over_ended["error"]) == ("FAILED", "States.DataLimitExceeded")
    # Both are far past what the limits let in.
    for job_id in (fits, over):
        with pytest.raises(RelevoError) as refused:
            require_envelope_fits(jobs.get_envelope(local_stack.table_name, job_id))
        assert refused.value.code is ErrorCode.PLAN_TOO_LARGE
    locks.release(local_stack.table_name, project_id, over)  # its execution died holding the lock
