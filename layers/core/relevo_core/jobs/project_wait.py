"""Why a job queued behind its project waits, as the views say it: a job of the project runs
(`project_running`), or the job holding the project's lock waits at its approval gate
(`project_waiting_for_approval`, naming that job, the stage it waits before and since when).

The state machine records only that the job waits for its project (the job record's
`queue_reason: project_running`, written once when it joins the line); who holds the lock, and
whether that job waits for a person, is read from the lock when a view is asked for
(docs/architecture.md, "Same-project serial")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from relevo_core.models.status import JobStatus, QueueReason
from relevo_core.store.locks import approval_gate


def gate_words(gate: Mapping[str, Any]) -> str:
    return (
        f"job {gate['job_id']} of its project waits for approval before {gate['stage']} since "
        f"{gate['since']}: this one "
        "starts when that one ends, and its queue_timeout_sec does not run meanwhile"
    )


def project_wait(
    recorded: str | None, gate: Mapping[str, Any] | None
) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """(queue_reason, queue_detail, waiting_behind) of a queued job whose record says
    `recorded`, given its project's approval gate (store.locks.approval_gate)."""
    if recorded != QueueReason.PROJECT_RUNNING.value or gate is None:
        return recorded, None, None
    return QueueReason.PROJECT_WAITING_FOR_APPROVAL.value, gate_words(gate), dict(gate)


def waits_for_project(row: Mapping[str, Any]) -> bool:
    return (
        row.get("status") == JobStatus.QUEUED.value
        and row.get("queue_reason") == QueueReason.PROJECT_RUNNING.value
    )


def with_project_waits(
    table: str,
    rows: list[dict[str, Any]],
    read_gate: Callable[[str, str], Mapping[str, Any] | None] = approval_gate,
) -> list[dict[str, Any]]:
    """Each listed row with its `queue_reason`, `queue_detail` and `waiting_behind` as the
    project's lock says them: one read of the lock per project that has a job waiting for it."""
    gates: dict[str, Mapping[str, Any] | None] = {}
    for row in rows:
        row.setdefault("queue_detail", None)
        row.setdefault("waiting_behind", None)
        if not waits_for_project(row):
            continue
        if row["project"] not in gates:
            gates[row["project"]] = read_gate(table, row["project"])
        row["queue_reason"], row["queue_detail"], row["waiting_behind"] = project_wait(
            row["queue_reason"], gates[row["project"]]
        )
    return rows
