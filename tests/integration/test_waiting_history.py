"""What waiting for a project costs in execution history, and how a wait ends.

Step Functions keeps at most 25,000 events in one execution's history; an execution that needs
more fails (Step Functions Developer Guide, "Avoid reaching the history quota"; service quotas:
"Maximum execution history size"). moto does not enforce it, so the cost of a wait is measured
here: the events one round of the waiting loop costs on the emulator, and the events of the wake
that ends it, times the rounds the definition lets a wait take. The loop's period and its bound
are read from job.asl.json, evaluated on the input intake gives a job with the longest
queue_timeout_sec a project may declare. A job may wait that long using under half the quota, and
behind the longest approval gate as well (its parks behind a gate spend none of its queue
timeout: execution.gate_wait), still under half.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from relevo_core.models.plan import ApprovalSettings
from relevo_core.models.project import Project
from tests.helpers.stack import (
    QueueSlots,
    history,
    job_record,
    lock_record,
    receive_stage,
    register_project,
    table_items,
    wait_for_execution,
    wait_until,
)
from tests.helpers.state_machine import (
    agent_runs,
    answer_gate_outside,
    enqueue_job,
    gate_outside,
    hold_outside,
    release_outside,
)

ASL = Path(__file__).resolve().parents[2] / "statemachines" / "job.asl.json"
HISTORY_QUOTA = 25_000
# The state a waiter's loop passes once per round: it reads the lock.
ROUND_START = "PeekProjectLock"


def _entered(event: dict[str, Any]) -> str | None:
    return event.get("stateEnteredEventDetails", {}).get("name")


def _path(document: Any, path: str) -> Any:
    """A `$.a.b` JSONPath of the definition, evaluated on a state's data."""
    for part in path.removeprefix("$.").split("."):
        document = document[part]
    return document


def _round_states(asl: dict[str, Any]) -> list[str]:
    """The states of one round of the waiting loop while the lock stays busy, in order: from
    ROUND_START along the choices' defaults and, out of a task that waits, along the path its
    timeout takes, until the round comes back to ROUND_START."""
    states, name, round_ = asl["States"], ROUND_START, []
    while True:
        round_.append(name)
        state = states[name]
        timeout = next(
            (c["Next"] for c in state.get("Catch", []) if "States.Timeout" in c["ErrorEquals"]), None
        )
        if state["Type"] == "Choice":
            busy = [c["Next"] for c in state["Choices"] if c.get("NumericGreaterThan") == 0]  # a budget left
            name = busy[0] if busy else state["Default"]
        else:
            name = timeout if "TimeoutSecondsPath" in state and timeout else state["Next"]
        if name == ROUND_START:
            return round_


def _period_and_bound(asl: dict[str, Any], round_: list[str], job_input: dict[str, Any]) -> tuple[int, int]:
    """How long one round lasts when nothing wakes the waiter (its Wait state's SecondsPath, or its
    task's TimeoutSecondsPath), and how many rounds the definition lets one wait take: the budget
    a Choice of the round counts down, or, with none, as many as fit in the wait."""
    states = asl["States"]
    (period_path,) = [
        states[n].get("SecondsPath") or states[n]["TimeoutSecondsPath"]
        for n in round_
        if "SecondsPath" in states[n] or "TimeoutSecondsPath" in states[n]
    ]
    period = int(_path(job_input, period_path))
    budgets = [
        c["Variable"]
        for n in round_
        if states[n]["Type"] == "Choice"
        for c in states[n]["Choices"]
        if c.get("NumericGreaterThan") == 0
    ]
    bound = (
        int(_path(job_input, budgets[0])) if budgets else math.ceil(job_input["queue_timeout_sec"] / period)
    )
    return period, bound


def _longest_wait_input(stack, settings, project_id) -> dict[str, Any]:
    """The execution input intake gives a job of a project whose queue_timeout_sec is the longest allowed."""
    from relevo_core.execution import execution_input
    from relevo_core.intake.enqueue import build_envelope
    from relevo_core.models.envelope import Trigger, TriggerType

    longest = next(m.le for m in Project.model_fields["queue_timeout_sec"].metadata if hasattr(m, "le"))
    project = Project.model_validate(
        {
            "id": project_id,
            "repo": "acme/x",
            "region_affinity": "eu-west",
            "stages": [{"name": "build", "run": "true"}],
            "queue_timeout_sec": longest,
        }
    )
    now = datetime.now(UTC)
    envelope = build_envelope(
        settings,
        project,
        Trigger(type=TriggerType.API, source="api"),
        "main",
        None,
        project.frozen_stages(),
        "k",
        now,
    )
    return execution_input(envelope, "https://queue")


def test_waiting_for_a_project_costs_under_half_of_the_history_quota(
    local_stack, intake_settings, project_id
):
    asl = json.loads(ASL.read_text())
    round_ = _round_states(asl)
    register_project(local_stack, project_id, [{"name": "build", "run": "true"}], queue_timeout_sec=200)
    hold_outside(local_stack, project_id)
    waiter = enqueue_job(local_stack, intake_settings, project_id)
    wait_until(
        lambda: sum(1 for e in history(local_stack, waiter) if _entered(e) == ROUND_START) >= 5,
        90,
        "five rounds of waiting",
    )

    release_outside(local_stack, project_id)
    task, _ = receive_stage(local_stack, waiter, timeout=30)
    events = history(local_stack, waiter)
    starts = [i for i, e in enumerate(events) if _entered(e) == ROUND_START]
    acquired = next(i for i, e in enumerate(events) if _entered(e) == "AcquireAsQueueHead")
    # Rounds between the first read of the lock and the one before the wake: the lock stayed busy.
    busy_rounds = [starts[k + 1] - starts[k] for k in range(len(starts) - 2)]
    # Each busy round enters the same states. The emulator's interpreter records a timed-out task's
    # closing events from its timer thread, so under load one of them may land after the next
    # round's first event: a round reads one short and its neighbour one long (CI saw [17, 17, 16,
    # 18]). The bound takes the longest round.
    assert max(busy_rounds) - min(busy_rounds) <= 2, busy_rounds
    for k in range(len(starts) - 2):
        assert [_entered(e) for e in events[starts[k] : starts[k + 1]] if _entered(e)] == round_, k
    per_round = max(busy_rounds)
    # The last round: from the last park (or wait) through the wake to the lock taken.
    per_wake = acquired - starts[-2]
    joining, leaving = (
        starts[0],
        next(i for i, e in enumerate(events) if _entered(e) == "RunStages") - acquired,
    )

    period, bound = _period_and_bound(
        asl, round_, _longest_wait_input(local_stack, intake_settings, project_id)
    )
    worst_round = max(per_round, per_wake)
    per_hour = math.ceil(3600 / period) * per_round
    whole_wait = joining + bound * worst_round + leaving
    print(
        f"\nwaiting for a project: {per_round} events per round (every {period} s when nothing wakes the "
        "waiter: "
        f"{per_hour} events per waiting hour), {per_wake} for a round a wake ends; a wait of the longest "
        f"queue_timeout_sec takes at most {bound} rounds: {joining} + {bound} x {worst_round} + {leaving} = "
        f"{whole_wait} "
        f"events of the {HISTORY_QUOTA:,} an execution may hold"
    )
    assert whole_wait < HISTORY_QUOTA / 2
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, waiter)["status"] == "SUCCEEDED"


def test_a_job_that_waits_out_its_queue_timeout_fails_leaves_the_line_and_gives_back_its_slot(
    local_stack, intake_settings, project_id
):
    register_project(local_stack, project_id, [{"name": "build", "run": "true"}], queue_timeout_sec=5)
    hold_outside(local_stack, project_id)
    slots = QueueSlots(local_stack, project_id)

    waiter = enqueue_job(local_stack, intake_settings, project_id)

    described = wait_for_execution(local_stack, waiter, timeout=90)
    assert (described["status"], described.get("error")) == ("FAILED", "Relevo.Timeout.Queue")
    record = job_record(local_stack, waiter)
    assert (record["status"], record["error_name"], record["last_writer"]) == (
        "failed",
        "Relevo.Timeout.Queue",
        f"state_machine:{waiter}",
    )
    assert not {"waiting_for", "queue_reason", "start_pending", "wake_token"} & set(record)
    assert waiter not in lock_record(local_stack, project_id).get("waiters", set())
    assert slots.change() == 0  # taken at the enqueue, given back when it gave up
    entry = {i["sk"]["S"]: i for i in table_items(local_stack, f"DLQ#{waiter}")}["DLQ"]
    assert entry["error"]["S"] == "Relevo.Timeout.Queue"
    release_outside(local_stack, project_id)


def _gate_round_states(asl: dict[str, Any]) -> list[str]:
    """The states of one round of the waiting loop while the lock's holder waits at its approval
    gate: as _round_states, but a Choice goes where the lock's gate sends it."""
    states, name, round_ = asl["States"], ROUND_START, []
    while True:
        round_.append(name)
        state = states[name]
        timeout = next(
            (c["Next"] for c in state.get("Catch", []) if "States.Timeout" in c["ErrorEquals"]), None
        )
        if state["Type"] == "Choice":
            gated = [c["Next"] for c in state["Choices"] if "$.peek.Item.gate" in json.dumps(c)]
            name = gated[0] if gated else state["Default"]
        else:
            name = timeout if "TimeoutSecondsPath" in state and timeout else state["Next"]
        if name == ROUND_START:
            return round_


def test_waiting_behind_the_longest_approval_gate_as_well_costs_under_half_of_the_history_quota(
    local_stack,
    intake_settings,
    project_id,
    monkeypatch,
):
    import relevo_core.execution as execution

    asl = json.loads(ASL.read_text())
    round_, gate_round = _round_states(asl), _gate_round_states(asl)
    assert "WaitBehindGate" in gate_round and "CountWaitCycle" not in gate_round
    # Given a job queued behind a holder of its project's lock that waits at its gate, whose parks
    # there last 1 s (intake's input otherwise: the rounds are counted, not their length)
    register_project(local_stack, project_id, [{"name": "build", "run": "true"}], queue_timeout_sec=200)
    hold_outside(local_stack, project_id)
    gate_outside(local_stack, project_id, "2026-12-01T10:00:00Z")
    monkeypatch.setattr(execution, "GATE_PARK_SEC", 1)
    waiter = enqueue_job(local_stack, intake_settings, project_id)
    monkeypatch.undo()

    def rounds(name: str) -> int:
        return sum(1 for e in history(local_stack, waiter) if _entered(e) == name)

    wait_until(lambda: rounds("WaitBehindGate") >= 5, 90, "five rounds behind the gate")
    # When the gate is answered, the job waits on (its queue timeout counting) and the holder lets the lock go
    answer_gate_outside(local_stack, project_id)
    wait_until(lambda: rounds("CountWaitCycle") >= 3, 90, "three rounds behind a running holder")
    release_outside(local_stack, project_id)
    task, _ = receive_stage(local_stack, waiter, timeout=30)

    # Then each round behind the gate costs the same, and the rounds of a whole wait fit under half the quota
    events = history(local_stack, waiter)
    starts = [i for i, e in enumerate(events) if _entered(e) == ROUND_START]
    acquired = next(i for i, e in enumerate(events) if _entered(e) == "AcquireAsQueueHead")
    spans = [(starts[k], starts[k + 1]) for k in range(len(starts) - 2)]
    names = [[_entered(e) for e in events[a:b] if _entered(e)] for a, b in spans]
    gated = {
        b - a
        for (a, b), states in zip(spans, names, strict=True)
        if "WaitBehindGate" in states and "IsQueueHead" not in states
    }
    busy = {
        b - a
        for (a, b), states in zip(spans, names, strict=True)
        if "WaitForProject" in states and "IsQueueHead" not in states
    }
    assert gate_round in names and round_ in names
    assert len(gated) == 1 and len(busy) == 1, (gated, busy)
    per_gate_round, per_round, per_wake = gated.pop(), busy.pop(), acquired - starts[-2]
    joining, leaving = (
        starts[0],
        next(i for i, e in enumerate(events) if _entered(e) == "RunStages") - acquired,
    )

    longest = _longest_wait_input(local_stack, intake_settings, project_id)
    _, cycles = _period_and_bound(asl, round_, longest)
    parks = longest["gate_wait"]["parks"]
    # Every round of both kinds is counted as the dearest of all: one a wake ends.
    worst_round = max(per_gate_round, per_round, per_wake)
    whole_wait = joining + (cycles + parks) * worst_round + leaving
    print(
        f"\nwaiting behind an approval gate: {per_gate_round} events per round (every "
        f"{longest['gate_wait']['park_sec']} s when "
        f"nothing wakes the waiter), {per_round} behind a running holder, {per_wake} for a round a wake "
        "ends; the longest gate "
        f"takes at most {parks} rounds, the longest queue_timeout_sec {cycles} more: {joining} + ({cycles} "
        f"+ {parks}) x "
        f"{worst_round} + {leaving} = {whole_wait} events of the {HISTORY_QUOTA:,} an execution may hold"
    )
    # The parks cover the longest approval timeout, and the park an approval interrupts.
    longest_gate = next(
        m.le for m in ApprovalSettings.model_fields["timeout_sec"].metadata if hasattr(m, "le")
    )
    assert (parks - 1) * longest["gate_wait"]["park_sec"] >= longest_gate
    assert whole_wait < HISTORY_QUOTA / 2
    agent_runs(local_stack, task)
    assert wait_for_execution(local_stack, waiter)["status"] == "SUCCEEDED"
